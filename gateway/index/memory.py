"""The in-process index: the embedded default, and the fallback while Redis is away."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from gateway.index.base import Capacities
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
        self._capacity = Capacities(prefix.block_size)
        self._clock = clock
        self._held: dict[str, dict[str, OrderedDict[int, int]]] = {}
        """model -> backend -> block hash -> last use (µs), least recently used first."""

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
        held = self._held.get(model, {})
        oldest = self._clock() - self._ttl

        def holds(backend: str, i: int) -> bool:
            return held[backend].get(hashes[i], oldest - 1) >= oldest

        return deepest(len(hashes), set(held), holds)

    def record(self, model: str, backend: str, hashes: Sequence[int]) -> None:
        now = self._clock()
        held = self._held.setdefault(model, {}).setdefault(backend, OrderedDict())
        # Deepest first, so a prompt's shallow blocks end up the most recently used and
        # trimming takes its tail first, keeping what remains a prefix.
        for i in range(len(hashes) - 1, -1, -1):
            held[hashes[i]] = now - i
            held.move_to_end(hashes[i])
        self._trim(held, now, self._capacity[backend])

    def bound(self, backend: str, tokens: int) -> None:
        self._capacity.bound(backend, tokens)

    def forget(self, model: str, backend: str, hashes: Sequence[int], keep_blocks: int) -> None:
        held = self._held.get(model, {}).get(backend)
        if held is not None:
            for h in hashes[max(keep_blocks, 0) :]:
                held.pop(h, None)

    async def size(self) -> int:
        now = self._clock()
        for backends in self._held.values():
            for backend, held in backends.items():
                self._trim(held, now, self._capacity[backend])
        return sum(len(held) for backends in self._held.values() for held in backends.values())

    def _trim(self, held: OrderedDict[int, int], now: int, capacity: int) -> None:
        """Drop expired handles, then the least recently used beyond the capacity."""
        excess = len(held) - capacity
        while held:
            h, last_use = next(iter(held.items()))
            if last_use >= now - self._ttl and excess <= 0:
                break
            del held[h]
            excess -= 1


def deepest(n: int, backends: set[str], holds: Callable[[str, int], bool]) -> dict[str, int]:
    """Per backend, how many leading blocks of n it holds, probing as few blocks as it can.

    A binary search for all backends at once: probing block ``mid`` splits the backends
    still in question into those holding it (their answer lies at or beyond ``mid``) and
    those not (before it). Holdings are prefix-closed (a backend holding block i holds
    the blocks before it), so a lookup costs about log2(n) probes per backend that holds
    anything. The Redis index runs the same search in Lua.
    """
    out: dict[str, int] = {}
    if n == 0:
        return out
    stack = [(0, n - 1, {b for b in backends if holds(b, 0)})]
    while stack:
        lo, hi, group = stack.pop()
        if not group:
            continue
        if lo == hi:
            out.update(dict.fromkeys(group, lo + 1))
            continue
        mid = (lo + hi + 1) // 2
        there = {b for b in group if holds(b, mid)}
        stack.append((mid, hi, there))
        stack.append((lo, mid - 1, group - there))
    return out
