"""The in-process limiter: the embedded default, and the model the Redis one must match.

State is two dicts: bucket -> theoretical arrival time, spend counter -> units. Counters
of past periods are dropped when the day changes; buckets are dropped once full again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from gateway.limits.base import (
    Bucket,
    Counter,
    Plan,
    Seed,
    Verdict,
    Window,
    adjust,
    gcra,
    period_id,
    window,
)
from gateway.limits.metrics import LimitMetrics

BucketId = tuple[str, str, str]


class MemoryLimiter:
    def __init__(
        self,
        metrics: LimitMetrics,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.metrics = metrics
        self._clock = clock
        self._wall = wall
        self._tats: dict[BucketId, float] = {}
        self._spend: dict[Counter, int] = {}
        self._day = 0

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def admit(self, plan: Plan, tokens: int) -> Verdict:
        return self.check(plan, tokens)

    def check(self, plan: Plan, tokens: int) -> Verdict:
        now = self._clock()
        for budget in plan.budgets:
            if self._spend.get(budget.counter, 0) >= budget.limit:
                return Verdict(False, self._windows(plan.buckets, now), budget, None)
        charged: list[tuple[BucketId, float]] = []
        for bucket in plan.buckets:
            tat = self._tats.get(_id(bucket))
            new, ok, wait = gcra(tat, now, bucket.limit, bucket.cost(tokens))
            if not ok:
                return Verdict(False, self._windows(plan.buckets, now), bucket, _finite(wait))
            charged.append((_id(bucket), new))
        self._tats.update(charged)
        return Verdict(True, self._windows(plan.buckets, now))

    def settle(self, plan: Plan, tokens: int, units: int) -> None:
        now = self._clock()
        self._prune(now)
        if tokens:
            for bucket in plan.buckets:
                if bucket.kind == "tokens":
                    tat = adjust(self._tats.get(_id(bucket)), now, bucket.limit, tokens)
                    self._tats[_id(bucket)] = tat
        if units:
            for counter in plan.counters:
                self._spend[counter] = self._spend.get(counter, 0) + units

    async def seed(self, seeds: Iterable[Seed]) -> None:
        for s in seeds:
            self._spend.setdefault(s.counter, s.units)

    def start_from(
        self, taken: Iterable[tuple[Bucket, int]], spent: Iterable[tuple[Counter, int]]
    ) -> None:
        """Begin buckets with units already taken and counters with spend already counted
        (new ones only): a replica taking over its share of shared limits mid-minute."""
        now = self._clock()
        for bucket, units in taken:
            if units > 0:
                self._tats.setdefault(_id(bucket), adjust(None, now, bucket.limit, units))
        for counter, units in spent:
            self._spend.setdefault(counter, units)

    async def flush(self) -> None:
        return None

    def _windows(self, buckets: Iterable[Bucket], now: float) -> tuple[Window, ...]:
        return tuple(window(b, self._tats.get(_id(b), now), now) for b in buckets)

    def _prune(self, now: float) -> None:
        """Once a day: forget past periods' spend and buckets that are full again."""
        wall = self._wall()
        day = wall.toordinal()
        if day == self._day:
            return
        self._day = day
        current = (period_id("day", wall), period_id("month", wall))
        self._spend = {c: u for c, u in self._spend.items() if c.period_id in current}
        self._tats = {b: t for b, t in self._tats.items() if t > now}


def _id(bucket: Bucket) -> BucketId:
    return (bucket.scope, bucket.kind, bucket.owner)


def _finite(wait: float) -> float | None:
    return None if wait == float("inf") else wait
