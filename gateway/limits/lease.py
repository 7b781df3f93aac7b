"""Quota leases: a replica's local share of a shared bucket, and its view of shared spend.

The Redis limiter does not ask Redis about every call. It asks for a *grant*: the call's
own cost plus some extra units of the bucket, charged to the shared bucket at once, and
spends the extra locally until it runs low (then it asks again, before it runs out). This
module is that bookkeeping, free of I/O, so the policy can be read and tested on its own:
a Lease per bucket, a SpendView per spend counter, a Shape per plan (holding the leases
and views its calls use) and an Ask per grant on its way (GRANT's argument, lua.py).

Grant size: about a second of the bucket's refill (limit / 60) when the bucket has room,
never more than a quarter of what remains after the call's own cost, and nothing extra
when little remains: near the limit every call is one round trip and exact, as without
leases. Units are never created here, only moved: the shared bucket is charged for every
unit a replica holds, so a limit is never exceeded; the price is that units one replica
holds and does not use are unavailable to the others until they go back (at the latest
``period`` after the grant, and at shutdown).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.limits.base import ALLOW, WINDOW, Bucket, Budget, Plan, Verdict

if TYPE_CHECKING:
    from gateway.limits.lua import Granted

SHARE = 4
"""A grant's extra is at most 1/SHARE of what the bucket holds after the call's own cost."""
LAG = 8
"""A verdict's headers may lag the leases by at most 1/LAG of a lease's target."""
NO_LAG = 1 << 62
"""The lag allowed in a kind the plan has no bucket of."""


def target(limit: int) -> int:
    """Extra units worth holding: a second of refill (0 below 60 a minute: no leasing)."""
    return limit // 60


@dataclass(slots=True)
class Lease:
    """One bucket's units held by this replica (a ``Redis key`` -> Lease map holds them)."""

    limit: int
    target: int = field(init=False)
    """Units worth holding (``target(limit)``; 0: every call asks Redis)."""
    held: int = 0
    """Units granted and not yet spent (refunded tokens come back here too)."""
    expires: float = 0.0
    """Monotonic time after which ``held`` must go back to the bucket, unspent."""
    asking: bool = False
    """A grant with extra is on its way: others ask for their own cost only."""
    remaining: int = 0
    """The shared bucket's room after the last grant (for the headers)."""
    reset: float = 0.0
    """Seconds the shared bucket needed then to be full again."""
    due: int = 0
    """Units the bucket must still be told of (the sender's next round): tokens settled
    here, and what calls admitted by local shares during an outage cost."""

    def __post_init__(self) -> None:
        self.target = target(self.limit)
        self.remaining = self.limit  # not seen yet: as full as it may be

    def live(self, now: float) -> bool:
        return now < self.expires

    def low(self, now: float, period: float) -> bool:
        """Worth topping up before it runs out: under half its target, or half its life gone."""
        if self.asking or self.target == 0:
            return False
        return self.held * 2 < self.target or self.expires - now < period / 2

    def granted(self, units: int, remaining: int, reset: float, now: float, period: float) -> None:
        self.remaining, self.reset = remaining, reset
        if units:
            self.held += units
            self.expires = now + period

    def reconcile(self, tokens: int, now: float) -> int:
        """Settle a call's tokens against the lease; returns what Redis must still be told."""
        if not self.live(now):
            return tokens
        if tokens < 0:  # a refund: held here up to the target, the rest goes back now
            keep = min(-tokens, max(self.target - self.held, 0))
            self.held += keep
            return tokens + keep
        took = min(self.held, tokens)
        self.held -= took
        return tokens - took

    def extra(self) -> int:
        """What to ask for beyond the call's cost, to top the lease up to its target."""
        return max(self.target - self.held, 0)

    def window(self) -> tuple[int, float]:
        """(remaining, reset) as the headers show them: the bucket as if the lease were spent
        back into it (what the bucket held at the last grant plus what is still held here)."""
        held = self.held
        step = WINDOW / self.limit
        return min(self.remaining + held, self.limit), max(self.reset - held * step, 0.0)


@dataclass(slots=True)
class SpendView:
    """A spend counter as this replica last read it, plus its own spend since."""

    base: int = 0
    """The counter's value in Redis, read after every settle this replica had sent."""
    mark: int = 0
    """``own`` when that read was sent."""
    read_at: float = -math.inf
    own: int = 0
    """Every unit of spend this replica has settled to the counter."""
    limit: int = 0
    """The budget on the counter (set by the newest plan that reads it)."""

    def value(self) -> int:
        return self.base + self.own - self.mark

    def spent(self) -> bool:
        return self.value() >= self.limit


@dataclass(slots=True)
class BucketLease:
    """One of a plan's buckets as the Redis limiter works with it."""

    key: str
    """The bucket's Redis key."""
    bucket: Bucket
    lease: Lease
    tokens: bool
    """It counts tokens (else requests)."""


@dataclass(slots=True)
class BudgetView:
    """One of a plan's budgets as the Redis limiter works with it."""

    key: str
    """The Redis key of the spend counter the budget reads."""
    budget: Budget
    view: SpendView


@dataclass(slots=True)
class Shape:
    """A plan as the Redis limiter works with it."""

    plan: Plan
    buckets: tuple[BucketLease, ...]
    budgets: tuple[BudgetView, ...]
    token_leases: tuple[Lease, ...]
    """The token buckets' leases (a call's tokens are settled against them)."""
    spend_keys: tuple[str, ...]
    """Every counter the call's spend goes to (those with a budget have a view in
    ``budgets``, where this replica's own spend is counted)."""
    period_ids: tuple[str, ...]
    grant_keys: list[str]
    refreshing: bool = False
    """A top-up of this plan's leases and spend views is on its way."""
    units_due: int = 0
    """Spend of its calls settled since the sender last took it..."""
    due: bool = False
    """...and whether the shape is on the sender's list (its leases may hold ``due`` too)."""
    verdict: Verdict = ALLOW
    """The last verdict for the plan's calls, which the next ones may reuse (a verdict and
    its headers cost more to build than the rest of a local answer)..."""
    verdict_at: float = -math.inf
    calls_since: int = 0
    tokens_since: int = 0
    """...built then, and the requests and tokens its calls have taken since..."""
    calls_lag: int = field(init=False)
    tokens_lag: int = field(init=False)
    """...and the most they may take (1/LAG of the smallest lease target of the kind)."""

    def __post_init__(self) -> None:
        self.calls_lag = min(
            (b.lease.target // LAG for b in self.buckets if not b.tokens), default=NO_LAG
        )
        self.tokens_lag = min(
            (b.lease.target // LAG for b in self.buckets if b.tokens), default=NO_LAG
        )

    def remember(self, verdict: Verdict, now: float) -> Verdict:
        self.verdict, self.verdict_at = verdict, now
        self.calls_since = self.tokens_since = 0
        return verdict

    def reuse(self, tokens: int, now: float, fresh: float) -> Verdict | None:
        """The last verdict, for a call that took ``tokens``, while its headers are close
        to the truth: at most ``fresh`` seconds old, and its calls have taken at most
        1/LAG of any lease's target since (None: build a new one)."""
        self.calls_since += 1
        self.tokens_since += tokens
        if (
            now - self.verdict_at >= fresh
            or self.calls_since > self.calls_lag
            or self.tokens_since > self.tokens_lag
        ):
            return None
        return self.verdict


@dataclass(slots=True)
class Take:
    """What a grant asks of one bucket."""

    need: int
    """Units the call needs from Redis (its cost less what its lease covered)."""
    extra: int
    """Units asked for beyond that, to top the lease up (granted as far as there is room)."""
    give: int
    """Units the lease held past its life, going back to the bucket."""
    took: int
    """Units of the call's cost taken from the lease (back to it if the call is refused)."""


@dataclass(slots=True)
class Ask:
    """One grant on its way: for a call (``done`` set) or a top-up (no one waits)."""

    shape: Shape
    done: asyncio.Future[Granted] | None
    takes: list[Take] = field(default_factory=list)
    """One per bucket of the plan, in its order."""
    marks: list[int] = field(default_factory=list)
    """Each budget view's ``own`` when the grant was sent (its read includes that)."""
