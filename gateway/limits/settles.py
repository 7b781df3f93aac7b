"""What the Redis limiter's calls owe the shared buckets and counters, waiting for a round.

A call's settle only counts on its shape (its spend, its leases' ``due``); the sender folds
the shapes that owe into SETTLE commands when a round goes, merged per set of keys, so
under load most settles are an addition here rather than a command of their own.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.flow import Period
from gateway.limits.base import period_end
from gateway.limits.lease import Shape
from gateway.limits.lua import Charge, settle_args
from gateway.limits.metrics import LimitMetrics


@dataclass(slots=True)
class Settle:
    """One SETTLE waiting: charges to buckets, spend to counters (their TTLs beside)."""

    keys: tuple[str, ...]
    """The charged buckets' keys, then the counters'."""
    charges: list[Charge]
    units: int
    ttls: list[int]

    def merge(self, charges: list[Charge], units: int) -> None:
        for mine, more in zip(self.charges, charges, strict=True):
            mine.amount += more.amount
        self.units += units

    def args(self) -> list[int]:
        return settle_args(self.charges, self.units, self.ttls)


class Settles:
    """Settles waiting for the next round, at most ``size`` of them (beyond: dropped and
    counted, as a failed one is)."""

    def __init__(self, size: int, metrics: LimitMetrics) -> None:
        self._size = size
        self._metrics = metrics
        self._waiting: dict[tuple[str, ...], Settle] = {}
        self._due: list[Shape] = []
        """Shapes whose calls settled since the last round (folded in then)."""
        self._expiry: dict[str, float] = {}
        """Period id -> epoch when its counters may go."""

    def __bool__(self) -> bool:
        return bool(self._waiting or self._due)

    def owe(self, shape: Shape) -> bool:
        """The shape has something to settle; True if it is the first since the last round."""
        if shape.due:
            return False
        shape.due = True
        self._due.append(shape)
        return len(self._due) == 1

    def add(
        self, keys: tuple[str, ...], charges: list[Charge], units: int, period_ids: tuple[str, ...]
    ) -> bool:
        """Queue a settle, merged into one already waiting for the same keys; True if it is
        a new one (the sender must know of it)."""
        waiting = self._waiting.get(keys)
        if waiting is not None:
            waiting.merge(charges, units)
            return False
        if len(self._waiting) >= self._size:
            self._metrics.dropped.inc()
            return False
        ttls = [self._ttl(pid) for pid in period_ids]
        self._waiting[keys] = Settle(keys, charges, units, ttls)
        return True

    def take(self) -> list[Settle]:
        """Everything owed, for a round: the shapes' debts folded in first."""
        self._fold()
        settles, self._waiting = list(self._waiting.values()), {}
        return settles

    def _fold(self) -> None:
        shapes, self._due = self._due, []
        for shape in shapes:
            shape.due = False
            charges: list[Charge] = []
            for b in shape.buckets:  # request buckets owe after an outage
                if b.lease.due:
                    charges.append(Charge(b.key, b.lease.due, b.lease.limit))
                    b.lease.due = 0
            units, shape.units_due = shape.units_due, 0
            if charges or units:
                keys = (*(c.key for c in charges), *shape.spend_keys)
                # TTLs for every counter, spend or not: a settle merged into this one
                # later may bring spend, and SETTLE expects a TTL for each counter it has.
                self.add(keys, charges, units, shape.period_ids)

    def _ttl(self, period_id: str) -> int:
        """Seconds a counter lives: its period and a day more (so a late settle still lands)."""
        gone = self._expiry.get(period_id)
        if gone is None:
            if len(self._expiry) > 64:
                self._expiry.clear()
            period: Period = "day" if period_id.startswith("d") else "month"
            gone = period_end(period, datetime.now(UTC)).timestamp() + 86400
            self._expiry[period_id] = gone
        return max(math.ceil(gone - time.time()), 1)
