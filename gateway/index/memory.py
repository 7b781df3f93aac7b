"""The in-process index: the embedded default, and the fallback while Redis is away."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from gateway.settings import PrefixSettings, RoutingSettings


class MemoryIndex:
    """Handles in dicts; updates are applied at once (no I/O, so nothing to queue)."""

    def __init__(
        self,
        routing: RoutingSettings,
        prefix: PrefixSettings,
        clock: Callable[[], int] = lambda: time.monotonic_ns() // 1000,
    ) -> None:
        self._ttl = int(routing.handle_ttl * 1_000_000)
        self._capacity = routing.backend_cache_tokens // prefix.block_size
        self._clock = clock
        self._handles: dict[str, dict[int, dict[str, int]]] = {}
        """model -> block hash -> backend -> last use (µs)."""
        self._lru: dict[tuple[str, str], OrderedDict[int, None]] = {}
        """(model, backend) -> its block hashes, least recently used first."""

    @property
    def healthy(self) -> bool:
        return True

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def flush(self) -> None:
        pass

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        handles = self._handles.get(model, {})
        oldest = self._clock() - self._ttl

        def holders(i: int) -> set[str]:
            return {b for b, t in handles.get(hashes[i], {}).items() if t >= oldest}

        return deepest(len(hashes), holders)

    def record(self, model: str, backend: str, hashes: Sequence[int]) -> None:
        now = self._clock()
        handles = self._handles.setdefault(model, {})
        lru = self._lru.setdefault((model, backend), OrderedDict())
        # Deepest first, so a prompt's shallow blocks end up the most recently used and
        # trimming takes its tail first, keeping what remains a prefix.
        for i in range(len(hashes) - 1, -1, -1):
            handles.setdefault(hashes[i], {})[backend] = now - i
            lru[hashes[i]] = None
            lru.move_to_end(hashes[i])
        self._trim(model, backend, now)

    def forget(self, model: str, backend: str, hashes: Sequence[int], keep_blocks: int) -> None:
        for h in hashes[max(keep_blocks, 0) :]:
            self._drop(model, backend, h)

    async def size(self) -> int:
        now = self._clock()
        for model, backend in list(self._lru):
            self._trim(model, backend, now)
        return sum(len(lru) for lru in self._lru.values())

    def _trim(self, model: str, backend: str, now: int) -> None:
        """Drop expired handles, then the least recently used beyond the capacity."""
        lru = self._lru[(model, backend)]
        handles = self._handles[model]
        while lru:
            h = next(iter(lru))
            expired = handles[h][backend] < now - self._ttl
            if not expired and not (self._capacity and len(lru) > self._capacity):
                break
            self._drop(model, backend, h)
        if not lru:
            del self._lru[(model, backend)]

    def _drop(self, model: str, backend: str, h: int) -> None:
        lru = self._lru.get((model, backend))
        if lru is not None:
            lru.pop(h, None)
        holders = self._handles.get(model, {}).get(h)
        if holders is not None:
            holders.pop(backend, None)
            if not holders:
                del self._handles[model][h]


def deepest(n: int, holders: Callable[[int], set[str]]) -> dict[str, int]:
    """Per backend, how many leading blocks of n it holds, probing as few blocks as it can.

    A binary search for all backends at once: each probe of block ``mid`` splits the
    backends still in question into those holding it (their answer lies at or beyond
    ``mid``) and those not (before it). Holdings are prefix-closed (a backend holding block
    i holds the blocks before it), so a lookup costs about log2(n) probes per distinct
    depth. The Redis index runs the same search in Lua.
    """
    out: dict[str, int] = {}
    if n == 0:
        return out
    stack = [(0, n - 1, holders(0))]
    while stack:
        lo, hi, group = stack.pop()
        if not group:
            continue
        if lo == hi:
            out.update(dict.fromkeys(group, lo + 1))
            continue
        mid = (lo + hi + 1) // 2
        there = holders(mid)
        stack.append((mid, hi, group & there))
        stack.append((lo, mid - 1, group - there))
    return out
