"""A bounded, time-limited memo of key lookups, so the hot path makes no database query.

Found and not-found answers are both kept for ``ttl`` seconds (a flood of one wrong key
costs one query per RENEW * ttl), the longest loaded beyond ``size`` are forgotten, and
concurrent misses for the same key share one load. An answer in the last fifth of its
life is renewed in the background by the first caller to see it, while every caller is
still answered from it: a key in steady use never waits for the database.

While the database fails, a found answer the database gave within ``stale_for`` seconds
is served as it was (renewed for another ttl each time a load fails), so an outage of the
key store does not lock out the keys in use; past that age, and for a not-found answer
(never a refusal for a key nobody could check), the failure is raised to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

V = TypeVar("V")

RENEW = 0.8
"""The share of an answer's life after which it is renewed in the background."""


@dataclass(slots=True)
class Entry(Generic[V]):
    value: V | None
    until: float
    """When it stops being fresh (a clock reading)."""
    renew_at: float
    """From then on, until ``until``, the first caller renews it in the background."""
    checked: float
    """When the source last gave this answer (a clock reading): the age of a stale one."""


class LookupCache(Generic[V]):
    def __init__(
        self,
        ttl: float,
        size: int,
        stale_on: tuple[type[BaseException], ...] = (),
        stale_for: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl
        self._size = size
        self._stale_on = stale_on
        self._stale_for = stale_for
        self._clock = clock
        self._entries: OrderedDict[Hashable, Entry[V]] = OrderedDict()
        self._stale: set[Hashable] = set()
        """Keys answered from a record the source failed to confirm, since it failed."""
        self._down = False
        """The last load failed (for the log: one line when that changes)."""
        self._loading: dict[Hashable, asyncio.Future[V | None]] = {}
        self._renewals: set[asyncio.Task[V | None]] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def fresh(self, key: Hashable) -> Entry[V] | None:
        """The entry while fresh and not due for renewal, else None: the whole of a hit,
        with no await (past ``renew_at``, ``get`` renews it and still answers at once)."""
        entry = self._entries.get(key)
        if entry is not None and self._clock() < entry.renew_at:
            return entry
        return None

    async def get(self, key: Hashable, load: Callable[[], Awaitable[V | None]]) -> V | None:
        """The cached answer while fresh (renewed in the background once it is due), else
        what ``load`` finds now (None: not found)."""
        entry = self._entries.get(key)
        now = self._clock()
        if entry is not None and now < entry.until:
            if now >= entry.renew_at and key not in self._loading:
                entry.renew_at = entry.until  # one renewal; meanwhile callers get this
                self._renew(key, load, entry)
            return entry.value
        waiting = self._loading.get(key)
        if waiting is not None:
            try:
                return await asyncio.shield(waiting)
            except asyncio.CancelledError:
                if not waiting.cancelled():
                    raise  # this caller was cancelled, not the load it waited for
            # The caller that was loading went away: load for ourselves.
        return await self._load(key, load, entry)

    def peek(self, key: Hashable) -> V | None:
        """The value held for key, fresh or not (None when there is none)."""
        entry = self._entries.get(key)
        return entry.value if entry is not None else None

    def clear(self) -> None:
        self._entries.clear()
        self._stale.clear()

    def stale(self) -> tuple[int, float]:
        """How many answers are being served stale (the source failed to confirm them, and
        they are within stale_for), and the age in seconds of the oldest (0 if none)."""
        now = self._clock()
        ages = [now - e.checked for k in self._stale if (e := self._entries.get(k))]
        ages = [age for age in ages if age <= self._stale_for]
        return len(ages), max(ages, default=0.0)

    async def aclose(self) -> None:
        """Stop the renewals on their way (at shutdown: the database is going away)."""
        for task in list(self._renewals):
            task.cancel()
        await asyncio.gather(*self._renewals, return_exceptions=True)

    def _renew(
        self, key: Hashable, load: Callable[[], Awaitable[V | None]], entry: Entry[V]
    ) -> None:
        task = asyncio.create_task(self._load(key, load, entry), name="key-cache-renewal")
        self._renewals.add(task)
        task.add_done_callback(self._renewed)

    def _renewed(self, task: asyncio.Task[V | None]) -> None:
        """A failed renewal leaves the answer as it was until it expires (then a caller
        loads it, and waits, as on a miss)."""
        self._renewals.discard(task)
        with contextlib.suppress(asyncio.CancelledError):
            if (exc := task.exception()) is not None:
                log.debug("key lookup renewal failed: %s", type(exc).__name__)

    async def _load(
        self, key: Hashable, load: Callable[[], Awaitable[V | None]], stale: Entry[V] | None
    ) -> V | None:
        done: asyncio.Future[V | None] = asyncio.get_running_loop().create_future()
        self._loading[key] = done
        try:
            value = await load()
        except self._stale_on as exc:
            self._failing(exc)
            if not self._servable(stale):
                _fail(done, exc)
                raise
            assert stale is not None
            self._stale.add(key)
            self._put(key, stale.value, stale.checked)
            done.set_result(stale.value)
            return stale.value
        except BaseException as exc:
            _fail(done, exc)
            raise
        finally:
            del self._loading[key]
        self._answering()
        self._stale.discard(key)
        self._put(key, value, self._clock())
        done.set_result(value)
        return value

    def _failing(self, exc: BaseException) -> None:
        if not self._down:
            self._down = True
            log.warning(
                "key lookups fail (%s: %s); keys the store answered for within %.0f s are "
                "served from those answers",
                type(exc).__name__,
                exc,
                self._stale_for,
            )

    def _answering(self) -> None:
        if self._down:
            self._down = False
            log.warning("key lookups answer again")

    def _servable(self, stale: Entry[V] | None) -> bool:
        """A found answer the source gave within stale_for may stand in for it."""
        if stale is None or stale.value is None:
            return False
        return self._clock() - stale.checked <= self._stale_for

    def _put(self, key: Hashable, value: V | None, checked: float) -> None:
        """Insert at the end: the entries are in the order they were loaded, so the first
        is the one loaded longest ago, the one to forget when the cache is full (a hit does
        not reorder them: that bookkeeping cost more than the rest of a hit, and an entry
        must be loaded again after ttl anyway)."""
        self._entries.pop(key, None)
        now = self._clock()
        self._entries[key] = Entry(value, now + self._ttl, now + self._ttl * RENEW, checked)
        while len(self._entries) > self._size:
            forgotten, _ = self._entries.popitem(last=False)
            self._stale.discard(forgotten)


def _fail(done: asyncio.Future[V], exc: BaseException) -> None:
    """Hand the failure to concurrent waiters (marked retrieved: nobody may be waiting)."""
    if isinstance(exc, asyncio.CancelledError):
        done.cancel()
    else:
        done.set_exception(exc)
        done.exception()
