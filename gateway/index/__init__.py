"""The prefix index: which backend holds which prompt prefix (prefill-state handles)."""

from __future__ import annotations

from gateway.index.base import PrefixIndex
from gateway.index.memory import MemoryIndex
from gateway.settings import Settings


def open_index(settings: Settings) -> PrefixIndex:
    """The index the settings ask for: in-process unless a Redis URL is configured."""
    return MemoryIndex(settings.routing, settings.prefix)
