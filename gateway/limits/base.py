"""Rate limits and budgets: what a call asks of them, what they answer, and the one algorithm.

Rate limits are GCRA (a token bucket kept as one number, the theoretical arrival time):
a limit of L per minute refills continuously at L/60 per second and holds at most a
minute's worth, so a fresh key may burst up to L at once, as OpenAI's limits behave.
A call passes only if every bucket it touches has room and no budget is spent; then, and
only then, all its buckets are charged (all or nothing). The in-process limiter runs this
module's Python; the Redis one runs the same steps in Lua on grants of units that its
replica then spends locally (lease.py), and contract tests hold both to the same answers
wherever the leases make no stated difference.

Budgets are spend counters per key and per team and per UTC day and month, in integer
units of 1e-10 USD (the ledger's scale, so they add up exactly). A call is refused once
the spend has reached the budget; the call that crosses it is served and metered.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, NamedTuple, Protocol

from gateway.flow import Period
from gateway.limits.metrics import LimitMetrics

Scope = Literal["key", "team"]
Kind = Literal["requests", "tokens"]

WINDOW = 60.0
"""Seconds a per-minute limit refills over (and the most it holds)."""
PERIODS: tuple[Period, ...] = ("day", "month")


def period_id(period: Period, at: datetime) -> str:
    at = at.astimezone(UTC)
    return at.strftime("d%Y%m%d") if period == "day" else at.strftime("m%Y%m")


def period_end(period: Period, at: datetime) -> datetime:
    """When the period containing ``at`` ends (UTC midnight / the first of next month)."""
    at = at.astimezone(UTC)
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day + timedelta(days=1)
    first = day.replace(day=1)
    return (first + timedelta(days=32)).replace(day=1)


@dataclass(slots=True, frozen=True)
class Bucket:
    scope: Scope
    kind: Kind
    owner: str
    """Key id or team name."""
    limit: int
    """Per minute."""

    def cost(self, tokens: int) -> int:
        """What a call takes from it: one request, or the tokens reserved for it."""
        return 1 if self.kind == "requests" else tokens


@dataclass(slots=True, frozen=True)
class Counter:
    """A spend counter: one owner's spend in one period (period_id: d20261129, m202611)."""

    scope: Scope
    owner: str
    period_id: str


@dataclass(slots=True, frozen=True)
class Budget:
    counter: Counter
    limit: int
    """Units of 1e-10 USD."""
    ends: datetime
    """End of the period: when a refused caller may try again."""


@dataclass(slots=True, frozen=True)
class Plan:
    """Everything a principal's calls ask of the limiter on one day (the same for each
    call, so it is built once and reused; the call's tokens are passed beside it)."""

    tag: str
    """The team: every key a call touches shares it (one Redis Cluster slot)."""
    buckets: tuple[Bucket, ...]
    budgets: tuple[Budget, ...]
    counters: tuple[Counter, ...]
    """Spend counters the call's cost goes to (day and month of key and team)."""
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_hash", hash((self.tag, self.buckets, self.budgets, self.counters))
        )

    def __hash__(self) -> int:
        """Computed once: the Redis limiter finds a plan's state by it on every call, and
        hashing its dozen nested records costs more than the rest of a local answer."""
        return self._hash


class Window(NamedTuple):
    """A bucket's state after the call, for the x-ratelimit-* headers (a tuple: one is
    built per bucket on every call)."""

    bucket: Bucket
    remaining: int
    reset: float
    """Seconds until the bucket is full again."""


@dataclass(slots=True, frozen=True, eq=False)
class Verdict:
    """Compared and hashed by identity: a limiter may hand one verdict to calls close
    together, and the limits stage builds the headers once per verdict."""

    allowed: bool
    windows: tuple[Window, ...] = ()
    refused_by: Bucket | Budget | None = None
    retry_after: float | None = None
    """Seconds until the refusing bucket has room; None if it never will (too large)."""


ALLOW = Verdict(allowed=True)
"""A call passes, with no window to report (no limits, or limits.on_outage: open)."""


@dataclass(slots=True, frozen=True)
class Seed:
    counter: Counter
    tag: str
    units: int
    ends: datetime


class Limiter(Protocol):
    metrics: LimitMetrics

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def check(self, plan: Plan, tokens: int) -> Verdict | None:
        """What ``admit`` would answer, if it can answer without I/O (the common call:
        the stage tries this first and awaits nothing); None when it needs the store."""
        ...

    async def admit(self, plan: Plan, tokens: int) -> Verdict:
        """Check every bucket and budget of the plan and charge the buckets if all pass
        (one request each from request buckets, ``tokens`` from token buckets).

        One round trip at most; never raises (a failing store answers as
        limits.on_outage says).
        """
        ...

    def settle(self, plan: Plan, tokens: int, units: int) -> None:
        """After the call: add ``tokens`` (may be negative: a refund) to its token buckets
        and ``units`` of spend to its counters. Queued, never blocks or raises."""
        ...

    async def seed(self, seeds: Iterable[Seed]) -> None:
        """Set counters that do not exist yet (spend the ledger knows after a restart)."""
        ...

    async def flush(self) -> None:
        """Wait until every settle queued so far has been applied (or dropped on error)."""
        ...


def gcra(tat: float | None, now: float, limit: int, cost: int) -> tuple[float, bool, float]:
    """One bucket: (new tat, allowed, seconds to wait); all times in seconds."""
    step = WINDOW / limit
    start = max(tat or now, now)
    new = start + cost * step
    excess = new - now - WINDOW
    if excess <= 1e-9:
        return new, True, 0.0
    return start, False, excess if cost <= limit else math.inf


def window(bucket: Bucket, tat: float, now: float) -> Window:
    step = WINDOW / bucket.limit
    used = max(tat - now, 0.0)
    return Window(bucket, max(math.floor((WINDOW - used) / step + 1e-9), 0), used)


def adjust(tat: float | None, now: float, limit: int, tokens: int) -> float:
    """A bucket after a settle: later for extra tokens, earlier (never before now) for a refund."""
    return max(max(tat or now, now) + tokens * WINDOW / limit, now)
