"""What the Redis limiter answers while Redis is unreachable (``limits.on_outage``).

``open`` lets every call pass; ``closed`` refuses the calls that have limits or budgets
(503, see stages/limits.py); ``local`` has each replica enforce its share of every limit
in process, with the in-process limiter on a plan whose limits are shares:

- a bucket of limit L: ``max(L // N, 1)`` a minute, N being the number of replicas this
  one last saw registered in Redis (each registers every HEARTBEAT seconds; a
  registration counts for REGISTERED seconds). It starts as full as this replica's share
  of what the shared bucket held at its last grant (lease.remaining // N), so a key that
  was at its limit when Redis went away does not get a fresh minute's burst;
- a budget B whose counter read V (this replica's view: the last read plus its own spend
  since): V plus ``(B - V) // N`` of it.

So the replicas together stay within each limit (a limit below N a minute, at one call
a minute per replica, excepted). A replica that never reached Redis counts itself alone.
The shares last as long as the outage: the in-process state starts afresh at each one.
What they let through is charged to the shared buckets once Redis answers (redis.py), so
a minute that spans the outage still holds its limit.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.limits.base import ALLOW, Plan, Verdict
from gateway.limits.lease import Shape
from gateway.limits.memory import MemoryLimiter
from gateway.limits.metrics import LimitMetrics
from gateway.settings import LimitsSettings

HEARTBEAT = 2.0
"""Seconds between a replica's registrations in Redis (a round of the sender's)."""
REGISTERED = 10.0
"""Seconds a registration counts: a replica gone for longer is no longer counted."""


PLANS = 10_000
"""Plans whose share is kept (one per active key and day, as the limiter's shapes)."""


class Fallback:
    """The limits while Redis is unreachable, by ``limits.on_outage``."""

    def __init__(self, settings: LimitsSettings, retry_after: float, metrics: LimitMetrics):
        self.mode = settings.on_outage
        self.replicas = 1
        """Replicas sharing the limits, as last read from Redis (1 until then)."""
        self._metrics = metrics
        self._unavailable = Verdict(allowed=False, retry_after=retry_after)
        """The closed mode's answer: refused by nothing in particular (the stage's 503)."""
        self._local = MemoryLimiter(metrics)
        self._shares: dict[Plan, Plan] = {}
        """Shared plan -> its local share, for the outage under way."""

    def begin(self) -> None:
        """An outage starts: the local shares start from what this replica knows now."""
        self._local = MemoryLimiter(self._metrics)
        self._shares.clear()

    def describe(self) -> str:
        """What the limits do now, for the log."""
        if self.mode == "local":
            return f"each of {self.replicas} replica(s) enforces its share of every limit"
        if self.mode == "closed":
            return "calls of keys with limits or budgets are refused (503)"
        return "every call passes unlimited (limits.on_outage: open)"

    def check(self, shape: Shape, tokens: int) -> Verdict:
        plan = shape.plan
        if self.mode == "open" or not (plan.buckets or plan.budgets):
            return ALLOW
        if self.mode == "closed":
            return self._unavailable
        return self._local.check(self._share(shape), tokens)

    def settle(self, shape: Shape, tokens: int, units: int) -> None:
        if self.mode == "local":
            self._local.settle(self._share(shape), tokens, units)

    def _share(self, shape: Shape) -> Plan:
        plan = shape.plan
        local = self._shares.get(plan)
        if local is not None:
            return local
        if len(self._shares) >= PLANS:
            self._shares.clear()
        n = self.replicas
        taken = []
        buckets = []
        for b in shape.buckets:
            share = replace(b.bucket, limit=max(b.bucket.limit // n, 1))
            buckets.append(share)
            taken.append((share, share.limit - min(b.lease.remaining // n, share.limit)))
        spent = []
        budgets = []
        for v in shape.budgets:
            value = v.view.value()
            budgets.append(replace(v.budget, limit=value + max(v.budget.limit - value, 0) // n))
            spent.append((v.budget.counter, value))
        local = replace(plan, buckets=tuple(buckets), budgets=tuple(budgets))
        self._local.start_from(taken, spent)
        self._shares[plan] = local
        return local
