"""The shared limiter in Redis: every replica counts against the same buckets and budgets.

Keys (all start with ``redis.key_prefix``; ``{team}`` is a Redis Cluster hash tag, so every
key one call touches lives in its team's slot and one script can reach them all):

- ``rl:{T}:<scope>:<owner>:<kind>``: a bucket's theoretical arrival time (µs, Redis clock),
  expiring when the bucket is full again;
- ``spend:{T}:<scope>:<owner>:<period>``: spend in 1e-10 USD units (INCRBY: exact), expiring
  a day after its period.

Most calls make no round trip. A replica holds *leases* (lease.py): units of a bucket
granted to it by one script (GRANT) that charged the shared bucket for them, spent here
call by call and topped up before they run out. Near a limit grants shrink to the call's
own cost, so there every call is one round trip and exact. Limits are never exceeded;
what a lease costs is that units one replica holds unused (at most about a second of
refill, and a quarter of what the bucket held, per bucket) are unavailable to the others
until they are ``redis.lease_period`` old; then they go back (the sender looks every half
period, so within 1.5 periods of the grant) and at shutdown.

Budgets are checked against a local view of each spend counter: its value as the last
grant read it (refreshed at least every ``lease_period``) plus this replica's own spend
since. So one replica is exact (the call that crosses a budget is served and metered, the
next refused). The settle of a call that spends a budget goes at once, not after
``settle_interval``: a replica reading the counter from then on refuses. One already holding
a view reads it again within ``lease_period``, so across replicas a budget can be overrun
by what the others serve in that time (``settle_interval + lease_period`` for spend short
of the budget, which other replicas see that much later).
Tokens refunded after a call stay in the lease up to its target (they were charged to
the shared bucket), so a refund rarely costs a write; beyond it they go back.

One sender task (sender.py) talks to Redis: a pipeline per round carries the grants
asked for since the last one and the settles waiting (settles.py); a call that needs a
grant waits on its round.

The x-ratelimit-* windows count what a replica holds as still in the bucket; a verdict
serves the plan's next calls for up to FRESH seconds while they take at most an eighth of
any of its leases' targets (building the windows and headers costs more than the rest of
a local answer), so the headers lag by at most an eighth of a second of the bucket's
refill.

While Redis is unreachable (sender.py says when that is) calls get ``limits.on_outage``'s
answer from outage.py; with local shares, what they cost is charged to the shared buckets
once Redis answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from datetime import UTC, datetime

from redis.asyncio import Redis, RedisCluster

from gateway.limits.base import ALLOW, Bucket, Counter, Plan, Seed, Verdict, Window
from gateway.limits.lease import Ask, BucketLease, BudgetView, Lease, Shape, SpendView, Take
from gateway.limits.lua import BUDGET, OK, Charge, Granted
from gateway.limits.metrics import LimitMetrics
from gateway.limits.outage import Fallback
from gateway.limits.sender import REDIS_ERRORS, Sender
from gateway.settings import LimitsSettings, RedisSettings

FRESH = 0.1
"""Seconds a plan's verdict (and so its x-ratelimit-* headers) may serve its next calls."""
SHAPES = 10_000
"""Plans whose key names are kept (one per active key and day); leases and spend views
are bounded by the same number."""


class RedisLimiter:
    def __init__(
        self,
        client: Redis | RedisCluster,
        settings: RedisSettings,
        limits: LimitsSettings,
        metrics: LimitMetrics,
    ) -> None:
        self._client = client
        self._prefix = settings.key_prefix
        self._period = settings.lease_period
        self.metrics = metrics
        self._fallback = Fallback(limits, settings.probe_interval, metrics)
        self._sender = Sender(client, settings, limits, metrics, self._fallback, self._sweep)
        self._shapes: dict[Plan, Shape] = {}
        self._leases: dict[str, Lease] = {}
        self._views: dict[str, SpendView] = {}
        """Bucket / counter key -> its lease / spend view; the shapes that use them keep
        them too, so the hot path looks nothing up."""
        metrics.degraded.labels(limits.on_outage).set(0)

    async def start(self) -> None:
        self._sender.start()

    async def aclose(self) -> None:
        await self._sender.stop()
        await self._client.aclose()

    async def flush(self) -> None:
        await self._sender.flush()

    def check(self, plan: Plan, tokens: int) -> Verdict | None:
        """The answer from what this replica holds, or None when it takes a round trip."""
        if not (plan.buckets or plan.budgets):
            return ALLOW
        shape = self._shape(plan)
        if self._sender.down:
            return self._outage_verdict(shape, tokens)
        return self._from_leases(shape, tokens, time.monotonic())

    async def admit(self, plan: Plan, tokens: int) -> Verdict:
        verdict = self.check(plan, tokens)
        if verdict is not None:
            return verdict
        shape, now = self._shape(plan), time.monotonic()
        ask = self._ask(shape, tokens, now, asyncio.get_running_loop().create_future())
        assert ask.done is not None
        try:
            granted = await ask.done
        except REDIS_ERRORS:
            return self._outage_verdict(shape, tokens)
        verdict = self._verdict(shape, granted)
        if verdict.allowed:  # the freshest: the next local calls reuse it
            shape.remember(verdict, time.monotonic())
        return verdict

    def settle(self, plan: Plan, tokens: int, units: int) -> None:
        """Only counts here: the sender turns what its shapes owe into SETTLE commands."""
        if not (tokens and plan.buckets) and not units:
            return
        shape = self._shape(plan)
        if self._sender.down:  # the call was admitted locally (or is one of the last before)
            self._fallback.settle(shape, tokens, units)
            if self._fallback.mode == "local":  # owed to the shared buckets, as its cost
                for lease in shape.token_leases:
                    lease.due += tokens
            tokens = 0
        if tokens:
            now = time.monotonic()
            for lease in shape.token_leases:
                lease.due += lease.reconcile(tokens, now)
        if units:
            shape.units_due += units
            for b in shape.budgets:
                b.view.own += units
                if b.view.spent():
                    self._sender.urge()
        self._sender.owe(shape)

    def _outage_verdict(self, shape: Shape, tokens: int) -> Verdict:
        """The fallback's answer while Redis is unreachable. With local shares, what a
        call is admitted for is owed to the shared buckets and charged once Redis answers,
        so a window that spans the outage holds its limit: the bucket learns of the calls
        the shares let through (a Redis that came back empty starts from them)."""
        verdict = self._fallback.check(shape, tokens)
        if verdict.allowed and shape.buckets and self._fallback.mode == "local":
            for b in shape.buckets:
                b.lease.due += tokens if b.tokens else 1
            self._sender.owe(shape)
        return verdict

    async def seed(self, seeds: Iterable[Seed]) -> None:
        """Never fails the start: without Redis, budgets fail open like everything else."""
        now = datetime.now(UTC)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for s in seeds:
                    ttl = max(int((s.ends - now).total_seconds()) + 86400, 1)
                    pipe.set(self._counter(s.tag, s.counter), s.units, nx=True, ex=ttl)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            self._sender.fail(exc)

    # -- the hot path: leases and spend views ------------------------------------------

    def _from_leases(self, shape: Shape, tokens: int, now: float) -> Verdict | None:
        """The answer from the leases and views: a refusal by a spent budget, a pass paid
        from the leases (with a top-up when they run low or age), or None when only Redis
        can answer."""
        stale = False
        for v in shape.budgets:
            age = now - v.view.read_at
            if age >= self._period:
                return None
            if v.view.spent():
                return Verdict(False, self._windows(shape), v.budget, None)
            stale = stale or age >= self._period / 2
        for b in shape.buckets:
            if not b.lease.live(now) or b.lease.held < b.bucket.cost(tokens):
                return None
        low = stale  # spend views past half their life: refresh
        for b in shape.buckets:
            b.lease.held -= b.bucket.cost(tokens)
            low = b.lease.low(now, self._period) or low
        if low and not shape.refreshing:  # top up and read the spend again, once
            shape.refreshing = True
            self._ask(shape, 0, now, None)
        verdict = shape.reuse(tokens, now, FRESH)
        if verdict is None:
            verdict = shape.remember(Verdict(True, self._windows(shape)), now)
        return verdict

    def _ask(
        self, shape: Shape, tokens: int, now: float, done: asyncio.Future[Granted] | None
    ) -> Ask:
        """Queue a grant: a call's cost (what its leases cannot cover) plus top-ups."""
        ask = Ask(shape, done)
        for b in shape.buckets:
            lease, give = b.lease, 0
            if not lease.live(now):
                give, lease.held = lease.held, 0  # aged out: back to the bucket
            cost = b.bucket.cost(tokens) if done is not None else 0
            took = min(lease.held, cost)
            lease.held -= took
            extra = 0 if lease.asking else lease.extra()
            lease.asking = lease.asking or extra > 0
            ask.takes.append(Take(need=cost - took, extra=extra, give=give, took=took))
        self._sender.ask(ask, now)
        return ask

    def _windows(self, shape: Shape) -> tuple[Window, ...]:
        """Each bucket as the headers show it."""
        return tuple(Window(b.bucket, *b.lease.window()) for b in shape.buckets)

    def _verdict(self, shape: Shape, granted: Granted) -> Verdict:
        windows = self._windows(shape)
        if granted.code == OK:
            return Verdict(True, windows)
        plan = shape.plan
        if granted.code == BUDGET:
            return Verdict(False, windows, plan.budgets[granted.which], None)
        return Verdict(False, windows, plan.buckets[granted.which], granted.wait)

    # -- shapes, leases and views: the per-key state -----------------------------------

    def _sweep(self, force: bool) -> None:
        """Give back what aged out unspent (everything, if forced): every lease is looked
        at, so the sender does this at most twice a lease period."""
        now = time.monotonic()
        for key, lease in self._leases.items():
            if lease.held and not lease.asking and (force or not lease.live(now)):
                self._give_back(key, lease)

    def _give_back(self, key: str, lease: Lease) -> None:
        self._sender.settle((key,), [Charge(key, -lease.held, lease.limit)], 0, ())
        lease.held = 0

    def _shape(self, plan: Plan) -> Shape:
        """The plan's keys, leases and views, built once per plan (key and day)."""
        shape = self._shapes.get(plan)
        if shape is None:
            if len(self._shapes) >= SHAPES:
                self._forget()
            shape = self._shapes[plan] = self._new_shape(plan)
        return shape

    def _new_shape(self, plan: Plan) -> Shape:
        buckets = tuple(
            BucketLease(key, b, self._lease(key, b.limit), tokens=b.kind == "tokens")
            for b in plan.buckets
            for key in (self._bucket(plan.tag, b),)
        )
        budgets = tuple(
            BudgetView(key, b, self._views.setdefault(key, SpendView()))
            for b in plan.budgets
            for key in (self._counter(plan.tag, b.counter),)
        )  # only counters with a budget have a view: the others are only ever written
        for v in budgets:
            v.view.limit = v.budget.limit
        return Shape(
            plan=plan,
            buckets=buckets,
            budgets=budgets,
            token_leases=tuple(b.lease for b in buckets if b.tokens),
            spend_keys=tuple(self._counter(plan.tag, c) for c in plan.counters),
            period_ids=tuple(c.period_id for c in plan.counters),
            grant_keys=[b.key for b in buckets] + [v.key for v in budgets],
        )

    def _lease(self, key: str, limit: int) -> Lease:
        """The bucket's lease (a new one when its limit changed: the old one's units go back)."""
        lease = self._leases.get(key)
        if lease is None or lease.limit != limit:
            if lease is not None and lease.held:  # (rare) the old lease's units go back
                self._give_back(key, lease)
            lease = self._leases[key] = Lease(limit)
        return lease

    def _forget(self) -> None:
        """Bound the per-key state: shapes, leases (their units go back first) and views
        start afresh. Grants on their way land in the old objects and are lost, which only
        keeps their units away until the buckets refill."""
        self._sweep(force=True)
        self._shapes.clear()
        self._leases.clear()
        self._views.clear()

    def _bucket(self, tag: str, b: Bucket) -> str:
        return f"{self._prefix}rl:{{{tag}}}:{b.scope}:{b.owner}:{b.kind}"

    def _counter(self, tag: str, c: Counter) -> str:
        return f"{self._prefix}spend:{{{tag}}}:{c.scope}:{c.owner}:{c.period_id}"
