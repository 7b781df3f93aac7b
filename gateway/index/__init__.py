"""The prefix index: which backend holds which prompt prefix (prefill-state handles)."""

from __future__ import annotations

from gateway.index.base import PrefixIndex
from gateway.index.memory import MemoryIndex
from gateway.settings import Settings


def open_index(settings: Settings) -> PrefixIndex:
    """The in-process index, or, with a Redis URL, the shared one with a local understudy.

    The caller owns the result: ``await index.start()`` and ``await index.aclose()``.
    """
    local = MemoryIndex(settings.routing, settings.prefix)
    if settings.redis.url is None:
        return local
    from gateway.index.redis import RedisIndex
    from gateway.index.resilient import ResilientIndex
    from gateway.redis_client import connect

    # The breaker decides when to try again; a lookup's own deadline is redis.timeout.
    client = connect(settings.redis, timeout=1.0)
    shared = RedisIndex(client, settings.redis, settings.routing, settings.prefix)
    return ResilientIndex(shared, local, settings.redis)
