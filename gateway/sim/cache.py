"""KV blocks with chained hashes, and the prefix cache that holds them.

As in vLLM's automatic prefix caching, block *i*'s hash covers block *i*'s tokens and,
through its parent's hash, every token before it; only full blocks are hashed and
cached. Blocks in use by running sequences are pinned (reference counted); blocks no
sequence uses stay cached in LRU order and are evicted only when space is needed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(
    tokens: Sequence[int], block_size: int, start: int = 0, parent: int = 0
) -> list[int]:
    """Hashes of the full blocks of tokens from block index start, chained from parent."""
    hashes: list[int] = []
    for i in range(start * block_size, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, *tokens[i : i + block_size]))
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Block accounting for one engine: pinned hashed blocks, private blocks, free LRU.

    Capacity is shared: `used` (pinned + private) plus the free cached blocks never
    exceed `capacity`; reserving space evicts the least recently freed blocks first.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._refs: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict()
        self._private = 0

    @property
    def used(self) -> int:
        """Blocks held by running sequences (what vLLM reports as KV cache usage)."""
        return len(self._refs) + self._private

    @property
    def cached(self) -> int:
        """Blocks that hold a hashed prefix, pinned or free."""
        return len(self._refs) + len(self._free)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of hashes are cached."""
        n = 0
        for h in hashes:
            if h not in self._refs and h not in self._free:
                break
            n += 1
        return n

    def acquire(self, hashes: Sequence[int]) -> None:
        """Pin cached blocks for a sequence that reuses them."""
        for h in hashes:
            if h in self._refs:
                self._refs[h] += 1
            else:
                del self._free[h]
                self._refs[h] = 1

    def reserve(self, count: int) -> bool:
        """Set aside count private blocks, evicting free ones; False if pinned blocks fill it."""
        if self.used + count > self.capacity:
            return False
        while self._free and self.used + len(self._free) + count > self.capacity:
            self._free.popitem(last=False)
        self._private += count
        return True

    def commit(self, h: int, from_private: bool = True) -> bool:
        """A block filled up with hash h: it becomes a cached block pinned by its sequence.

        from_private: the block was reserved earlier (else it takes new space, evicting
        if needed). If another sequence cached the same block meanwhile, this one shares
        it and its private block returns to the pool, as vLLM deduplicates. Returns
        whether the block is new to the cache.
        """
        if from_private:
            self._private -= 1
        if h in self._refs:
            self._refs[h] += 1
            return False
        new = h not in self._free
        if not new:
            del self._free[h]
        elif not from_private and self._free and self.used + len(self._free) >= self.capacity:
            self._free.popitem(last=False)
        self._refs[h] = 1
        return new

    def release(self, hashes: Sequence[int], private: int) -> None:
        """Unpin a finished or aborted sequence's blocks.

        Tail blocks are freed first so that they are evicted before the prefix they
        extend, which other requests are likelier to share (vLLM frees in reverse too).
        """
        self._private -= private
        for h in reversed(hashes):
            n = self._refs[h] - 1
            if n:
                self._refs[h] = n
            else:
                del self._refs[h]
                self._free[h] = None
