"""The index's interface, shared by the in-process, Redis and resilient implementations.

A *handle* says "backend B holds the KV cache of block hash H of model M, last used at t".
Because block hashes chain, holding hash *i* means holding the prompt's first *i + 1*
blocks, so a lookup answers with a number of leading blocks per backend. Handles expire
``handle_ttl`` seconds after their last use, and a backend keeps only as many of its most
recently used handles as its KV cache holds blocks, as the engine reports it (deepest
blocks of the oldest prompts go first, as vLLM evicts them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

UNKNOWN_CAPACITY_TOKENS = 1 << 22
"""Assumed until a backend reports its KV capacity: more than one vLLM instance's KV cache
holds (about 4M tokens), yet a bound on the index's memory per backend."""


class Capacities:
    """Handles each backend may keep: its KV capacity in the index's blocks."""

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        self._blocks: dict[str, int] = {}
        self._unknown = self.blocks_of(UNKNOWN_CAPACITY_TOKENS)

    def bound(self, backend: str, tokens: int) -> None:
        self._blocks[backend] = self.blocks_of(tokens)

    def blocks_of(self, tokens: int) -> int:
        return max(tokens // self._block_size, 1)

    def __getitem__(self, backend: str) -> int:
        return self._blocks.get(backend, self._unknown)


class PrefixIndex(Protocol):
    @property
    def healthy(self) -> bool:
        """False while the shared store is failing and answers come from a fallback."""
        ...

    async def start(self) -> None:
        """Start the background work the index owns (update flusher, recovery probe)."""
        ...

    async def aclose(self) -> None:
        """Apply what is queued where possible, stop the background work, close clients."""
        ...

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        """Backend name -> number of leading blocks of ``hashes`` it holds (absent: none).

        One round trip at most; never raises from the resilient index.
        """
        ...

    def record(self, model: str, backend: str, hashes: Sequence[int]) -> None:
        """Note that backend now holds these blocks (renewing them); queued, never blocks."""
        ...

    def bound(self, backend: str, tokens: int) -> None:
        """The backend's KV cache holds ``tokens`` (``vllm:cache_config_info``'s blocks x
        block size): keep no more of its handles than that from its next record on."""
        ...

    def forget(self, model: str, backend: str, hashes: Sequence[int], keep_blocks: int) -> None:
        """Drop backend's handles for hashes[keep_blocks:]; queued, never blocks."""
        ...

    async def flush(self) -> None:
        """Wait until every update queued so far has been applied (or dropped on error)."""
        ...

    async def size(self) -> int:
        """Live handles, for a gauge; off the request path (may scan)."""
        ...
