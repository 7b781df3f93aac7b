"""A bounded, time-limited memo of key lookups, so the hot path makes no database query.

Found and not-found answers are both kept for ``ttl`` seconds (a flood of one wrong key
costs one query per ttl), the longest loaded beyond ``size`` are forgotten, and
concurrent misses for the same key share one load. While the database fails, an expired
answer is served rather than locking out every key whose entry just aged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

V = TypeVar("V")


@dataclass(slots=True)
class Entry(Generic[V]):
    value: V | None
    until: float
    """When it stops being fresh (a clock reading)."""


class LookupCache(Generic[V]):
    def __init__(
        self,
        ttl: float,
        size: int,
        stale_on: tuple[type[BaseException], ...] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl
        self._size = size
        self._stale_on = stale_on
        self._clock = clock
        self._entries: OrderedDict[Hashable, Entry[V]] = OrderedDict()
        self._loading: dict[Hashable, asyncio.Future[V | None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def fresh(self, key: Hashable) -> Entry[V] | None:
        """The entry while fresh, else None: the whole of a hit, with no await."""
        entry = self._entries.get(key)
        if entry is not None and self._clock() < entry.until:
            return entry
        return None

    async def get(self, key: Hashable, load: Callable[[], Awaitable[V | None]]) -> V | None:
        """The cached answer while fresh, else what ``load`` finds now (None: not found)."""
        entry = self.fresh(key)
        if entry is not None:
            return entry.value
        entry = self._entries.get(key)
        waiting = self._loading.get(key)
        if waiting is not None:
            try:
                return await asyncio.shield(waiting)
            except asyncio.CancelledError:
                if not waiting.cancelled():
                    raise  # this caller was cancelled, not the load it waited for
            # The caller that was loading went away: load for ourselves.
        return await self._load(key, load, entry)

    def clear(self) -> None:
        self._entries.clear()

    async def _load(
        self, key: Hashable, load: Callable[[], Awaitable[V | None]], stale: Entry[V] | None
    ) -> V | None:
        done: asyncio.Future[V | None] = asyncio.get_running_loop().create_future()
        self._loading[key] = done
        try:
            value = await load()
        except self._stale_on as exc:
            if stale is None:
                _fail(done, exc)
                raise
            log.warning("key lookup failed, serving the cached answer: %s", type(exc).__name__)
            value = stale.value
        except BaseException as exc:
            _fail(done, exc)
            raise
        finally:
            del self._loading[key]
        self._put(key, value)
        done.set_result(value)
        return value

    def _put(self, key: Hashable, value: V | None) -> None:
        """Insert at the end: the entries are in the order they were loaded, so the first
        is the one loaded longest ago, the one to forget when the cache is full (a hit does
        not reorder them: that bookkeeping cost more than the rest of a hit, and an entry
        must be loaded again after ttl anyway)."""
        self._entries.pop(key, None)
        self._entries[key] = Entry(value, self._clock() + self._ttl)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)


def _fail(done: asyncio.Future[object], exc: BaseException) -> None:
    """Hand the failure to concurrent waiters (marked retrieved: nobody may be waiting)."""
    if isinstance(exc, asyncio.CancelledError):
        done.cancel()
    else:
        done.set_exception(exc)
        done.exception()
