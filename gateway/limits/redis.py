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

Within the replica a plan's calls spend from a *pocket* (lease.py: an eighth of each of
its leases' targets, taken at once) and look at nothing but the plan's budgets; refunds go
into the pocket. The first call past the half life of a lease or view asks for the top-up
while the calls go on from the pocket; the pocket goes back to the leases when it is spent
or too old, at the sweep after its leases' life, and at shutdown.

One sender task talks to Redis: every pipeline carries the grants asked for since the last
one (concurrent calls share a round trip) and, before them, every settle waiting (spend
and token reconciliation, merged per key), so a grant's read of a counter includes all of
this replica's spend sent so far. Settles go at most every ``redis.settle_interval``. A
round costs the gateway 200-360 us of CPU, so the sender is woken only when it must be: a
call waiting on a grant goes at once; a top-up (no call waits on it) rides with the next
round of settles if that comes within a quarter of ``lease_period``, else goes then; under
load the sender wakes at the settle interval by itself, so a call's settle never wakes it.

The x-ratelimit-* windows count what a replica holds as still in the bucket; a verdict is
built when a plan's pocket is filled and serves the calls it pays for, for up to FRESH
seconds (building the windows and headers cost more than the rest of a local answer), so
the headers lag by at most a pocket: an eighth of a second of the bucket's refill.

A round may take ``limits.redis_timeout`` (1 s): calls seldom wait on one, and a busy
event loop must not pass for a dead Redis. A round that times out is sent again (its calls
wait; what a lost answer granted stays charged, what it gave back is not given again, so a
retry never makes room); ``limits.outage_after`` timeouts in a row, or one real failure
(refused or reset connection, an error reply), make an outage: a warning is logged,
gateway_limits_degraded{mode} is 1, and calls get ``limits.on_outage``'s answer from
outage.py without waiting on Redis. Settles queued meanwhile wait (merged per key) and go
once Redis is back, with what the calls admitted by local shares cost the buckets. The
sender probes Redis every redis.probe_interval with the heartbeat that also registers the
replica (every HEARTBEAT seconds while Redis answers: the count of replicas the local
shares divide by) and, when it answers, limits are shared again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from gateway.limits.base import (
    ALLOW,
    Bucket,
    Counter,
    Plan,
    Seed,
    Verdict,
    Window,
    period_end,
)
from gateway.limits.lease import Ask, Lease, Shape, SpendView
from gateway.limits.lua import GRANT, HEARTBEAT, SETTLE
from gateway.limits.metrics import LimitMetrics
from gateway.limits.outage import HEARTBEAT as HEARTBEAT_INTERVAL
from gateway.limits.outage import REGISTERED, Fallback
from gateway.settings import LimitsSettings, RedisSettings

log = logging.getLogger(__name__)

REDIS_ERRORS = (RedisError, OSError, TimeoutError)
TIMEOUTS = (RedisTimeout, TimeoutError)
"""A round that took too long: Redis may only be slow (or this loop busy), not gone."""
FRESH = 0.1
"""Seconds a plan's verdict (and so its x-ratelimit-* headers) serves its pocket's calls."""
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
        self._settings = settings
        self._limits = limits
        self._period = settings.lease_period
        self.metrics = metrics
        scripts = list(map(client.register_script, (GRANT, SETTLE, HEARTBEAT)))
        self._scripts = {s.sha: s for s in scripts}
        self._grant_sha, self._settle_sha, self._beat_sha = (s.sha for s in scripts)
        self._replica = uuid.uuid4().hex
        self._replicas_key = f"{self._prefix}limits:replicas"
        self._beat_at = 0.0
        """When the next heartbeat is due (monotonic): the first round carries one."""
        self._asks: list[Ask] = []
        self._inflight: list[Ask] = []
        """The grants of the round on its way (failed with it if it fails unexpectedly)."""
        self._pending: dict[tuple[str, ...], list[Any]] = {}
        self._due: list[Shape] = []
        """Shapes whose calls settled since the last round (folded into _pending then)."""
        self._leases: dict[str, Lease] = {}
        self._views: dict[str, SpendView] = {}
        """Bucket / counter key -> its lease / spend view; the shapes that use them keep
        them too, so the hot path looks nothing up."""
        self._expiry: dict[str, float] = {}
        """Period id -> epoch when its counters may go."""
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._urgent = False
        self._last_settle = 0.0
        self._calls_waiting = False
        """An ask in ``_asks`` has a call waiting on it: the next round goes at once."""
        self._topup_by = math.inf
        """When the earliest top-up in ``_asks`` must go at the latest."""
        self._sleep_until = math.inf
        """When the sender wakes by itself (monotonic): an event due later must wake it."""
        self._last_sweep = 0.0
        self._task: asyncio.Task[None] | None = None
        self._shapes: dict[int, Shape] = {}
        self._down = False
        """Redis is unreachable: calls get the fallback's answer, the sender only probes."""
        self._probe_at = 0.0
        self._timeouts = 0
        """Rounds in a row that timed out (limits.outage_after of them: an outage)."""
        self._fallback = Fallback(limits, settings.probe_interval, metrics)
        metrics.degraded.labels(limits.on_outage).set(0)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._sender(), name="limits-sender")

    async def aclose(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.flush(), timeout=0.5)  # grants on their way land
                self._return_leases(force=True)
                await asyncio.wait_for(self.flush(), timeout=0.5)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            if not self._down:  # no longer one of the replicas sharing the limits
                with contextlib.suppress(*REDIS_ERRORS):
                    await self._client.zrem(self._replicas_key, self._replica)
        await self._client.aclose()

    def check(self, plan: Plan, tokens: int) -> Verdict | None:
        """The answer from what this replica holds, or None when it takes a round trip.
        Most calls spend from the plan's pocket and look at nothing but its budgets: one
        function, as this runs on every call."""
        if not (plan.buckets or plan.budgets):
            return ALLOW
        shape = self._shape(plan)
        if self._down:
            return self._outage_verdict(shape, tokens)
        now = time.monotonic()
        if now < shape.until and shape.calls > 0 and shape.tokens >= tokens:
            for view in shape.spend:
                if view.spent:
                    break
            else:
                shape.calls -= 1
                shape.tokens -= tokens
                if now >= shape.refresh_at:
                    self._refresh(shape, now)
                if now - shape.verdict_at >= FRESH:
                    return self._fresh_verdict(shape, now)
                return shape.verdict
        shape.empty()
        return self._from_leases(shape, tokens, now)

    async def admit(self, plan: Plan, tokens: int) -> Verdict:
        verdict = self.check(plan, tokens)
        if verdict is not None:
            return verdict
        shape, now = self._shape(plan), time.monotonic()
        ask = self._ask(shape, tokens, now, asyncio.get_running_loop().create_future())
        assert ask.done is not None
        try:
            code, which, wait = await ask.done
        except REDIS_ERRORS:
            return self._outage_verdict(shape, tokens)
        verdict = self._verdict(shape, plan, code, which, wait)
        if verdict.allowed:  # the freshest: the next local calls reuse it
            shape.verdict, shape.verdict_at = verdict, time.monotonic()
        return verdict

    def settle(self, plan: Plan, tokens: int, units: int) -> None:
        """Only counts here: the sender turns what its shapes owe into SETTLE commands."""
        if not (tokens and plan.buckets) and not units:
            return
        shape = self._shape(plan)
        if self._down:  # the call was admitted locally (or is one of the last before)
            self._fallback.settle(shape, tokens, units)
            if self._fallback.mode == "local":  # owed to the shared buckets, as its cost
                for _, lease in shape.tpm:
                    lease.due += tokens
            tokens = 0
        if tokens:
            if shape.until > -math.inf and shape.tokens >= tokens:  # refunds: any size
                shape.tokens -= tokens  # the pocket: taken from every token lease alike
            else:
                now = time.monotonic()
                for _, lease in shape.tpm:
                    lease.due += lease.reconcile(tokens, now)
        if units:
            shape.units_due += units
            for view in shape.spend:
                view.own += units
                if view.base + view.own - view.mark >= view.limit:  # judge(), inlined
                    view.spent = True
                    self._urgent = True  # a spent budget reaches the others now
                    self._wake.set()
        self._owe(shape)

    def _owe(self, shape: Shape) -> None:
        """The shape has something to settle: the sender's next round folds it in."""
        if not shape.due:
            shape.due = True
            self._due.append(shape)
            if len(self._due) == 1:
                self._settle_soon()

    def _outage_verdict(self, shape: Shape, tokens: int) -> Verdict:
        """The fallback's answer while Redis is unreachable. With local shares, what a
        call is admitted for is owed to the shared buckets and charged once Redis answers,
        so a window that spans the outage holds its limit: the bucket learns of the calls
        the shares let through (a Redis that came back empty starts from them)."""
        verdict = self._fallback.check(shape, tokens)
        if verdict.allowed and shape.buckets and self._fallback.mode == "local":
            for _, _, tokens_kind, lease in shape.buckets:
                lease.due += tokens if tokens_kind else 1
            self._owe(shape)
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
            self._failed(exc)

    async def flush(self) -> None:
        """Send everything waiting (settles and top-ups) now, and wait until it landed
        (at once while Redis is unreachable: the settles wait for it)."""
        if self._down:
            return
        if self._asks:
            self._idle.clear()
        if not self._idle.is_set():
            self._urgent = True
            self._wake.set()
        await self._idle.wait()

    # -- the hot path: leases and spend views ------------------------------------------

    def _from_leases(self, shape: Shape, tokens: int, now: float) -> Verdict | None:
        """The answer from the leases and views themselves (then a new pocket): a refusal,
        a top-up when they run low or age, or None when only Redis can answer."""
        stale = False
        for _, budget, view in shape.budgets:
            age = now - view.read_at
            if age >= self._period:
                return None
            if view.spent:
                return Verdict(False, self._windows(shape), budget, None)
            stale = stale or age >= self._period / 2
        for _, _, tokens_kind, lease in shape.buckets:
            if lease.expires <= now or lease.held < (tokens if tokens_kind else 1):
                return None
        low = stale  # spend views past half their life: refresh
        for _, _, tokens_kind, lease in shape.buckets:
            lease.held -= tokens if tokens_kind else 1
            low = lease.low(now, self._period) or low
        if low:
            self._refresh(shape, now)
        shape.fill(now, self._period)
        return self._fresh_verdict(shape, now)

    def _refresh(self, shape: Shape, now: float) -> None:
        """Top up the plan's leases and read its spend again (once until that lands)."""
        shape.refresh_at = math.inf
        if not shape.refreshing:
            shape.refreshing = True
            self._ask(shape, 0, now, None)

    def _fresh_verdict(self, shape: Shape, now: float) -> Verdict:
        shape.verdict = Verdict(True, self._windows(shape))
        shape.verdict_at = now
        return shape.verdict

    def _ask(self, shape: Shape, tokens: int, now: float, done: asyncio.Future[Any] | None) -> Ask:
        """Queue a grant: a call's cost (what its leases cannot cover) plus top-ups."""
        ask = Ask(shape, done)
        for _, bucket, _, lease in shape.buckets:
            give = 0
            if not lease.live(now):
                give, lease.held = lease.held, 0  # aged out: back to the bucket
            cost = bucket.cost(tokens) if done is not None else 0
            took = min(lease.held, cost)
            lease.held -= took
            more = 0 if lease.asking else lease.extra()
            lease.asking = lease.asking or more > 0
            ask.buckets.append((cost - took, more, give, took))
        self._asks.append(ask)
        if done is not None:
            self._calls_waiting = True
            self._wake.set()
        else:
            self._topup_by = min(self._topup_by, now + self._period / 4)
            self._wake_by(self._topup_by)
        return ask

    def _windows(self, shape: Shape) -> tuple[Window, ...]:
        """Each bucket as the headers show it (what the plan's pocket holds counted in)."""
        return tuple(
            Window(bucket, *lease.window(shape.tokens if tokens_kind else shape.calls))
            for _, bucket, tokens_kind, lease in shape.buckets
        )

    def _verdict(self, shape: Shape, plan: Plan, code: int, which: int, wait: int) -> Verdict:
        windows = self._windows(shape)
        if code == 0:
            return Verdict(True, windows)
        if code == 2:
            return Verdict(False, windows, plan.budgets[which - 1], None)
        return Verdict(False, windows, plan.buckets[which - 1], None if wait < 0 else wait / 1e6)

    # -- the sender: one pipeline per round, grants and settles together -----------------

    async def _sender(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_round()):
                    await self._wake.wait()
            self._sleep_until = -math.inf  # awake: nobody needs to wake it
            self._wake.clear()
            if self._down:
                if time.monotonic() >= self._probe_at:
                    await self._probe()
                continue
            if time.monotonic() - self._last_sweep >= self._period / 2:
                self._return_leases(force=False)
            while self._round_due():
                try:
                    await self._round()
                except Exception as exc:
                    # This task must outlive any surprise, or every later check would hang.
                    log.exception("limits: a round failed unexpectedly; letting the calls through")
                    self._fail_asks(RedisError(f"limits round failed: {exc!r}"))
                self._inflight = []
            if not (self._pending or self._due):
                self._urgent = False
                self._idle.set()

    def _next_round(self) -> float:
        """Seconds until the next round is due: settles waiting (or, after a round of
        settles, those the calls will owe by then: under load the sender is not woken for
        them), the earliest top-up waiting, or the sweep for leases that aged out."""
        now = time.monotonic()
        if self._down:
            self._sleep_until = self._probe_at
            return max(self._probe_at - now, 0.0)
        settles = self._last_settle + self._settings.settle_interval
        at = min(now + self._period / 2, self._topup_by, self._beat_at)
        if self._pending or self._due or settles > now:
            at = min(at, settles)
        self._sleep_until = at
        return max(at - now, 0.0)

    def _round_due(self) -> bool:
        if self._down:
            return False
        if self._calls_waiting or (self._asks and self._urgent):
            return True
        now = time.monotonic()
        if (self._asks and now >= self._topup_by) or now >= self._beat_at:
            return True
        if not (self._pending or self._due):
            return False
        return self._urgent or now - self._last_settle >= self._settings.settle_interval

    async def _round(self) -> None:
        """Settles first, so the grants' reads of the counters include them."""
        asks = self._inflight = self._asks
        self._asks, self._calls_waiting, self._topup_by = [], False, math.inf
        self._fold()
        settles, self._pending = list(self._pending.items()), {}
        if settles:
            self._last_settle = time.monotonic()
        commands = [(self._settle_sha, list(keys), args) for keys, args in settles]
        marks = [[view.own for _, _, view in ask.shape.budgets] for ask in asks]
        commands += [(self._grant_sha, ask.shape.grant_keys, [ask.render()]) for ask in asks]
        beat = time.monotonic() >= self._beat_at
        if beat:
            self._beat_at = time.monotonic() + HEARTBEAT_INTERVAL
            commands.append(self._heartbeat())
        try:
            replies = await self._run(commands)
        except REDIS_ERRORS as exc:
            # Settles are dropped, not retried: a half-applied pipeline retried counts twice.
            self.metrics.dropped.inc(len(settles))
            if beat:
                self._beat_at = 0.0
            if not self._failed(exc):
                self._ask_again(asks)
            return
        self._timeouts = 0
        self.metrics.dropped.inc(sum(isinstance(r, Exception) for r in replies[: len(settles)]))
        if beat:
            self._counted(replies.pop())
        now = time.monotonic()
        for ask, mark, reply in zip(asks, marks, replies[len(settles) :], strict=True):
            self._apply(ask, mark, reply, now)

    def _heartbeat(self) -> tuple[str, list[str], list[Any]]:
        """Register this replica and count those registered (HEARTBEAT's arguments)."""
        return self._beat_sha, [self._replicas_key], [self._replica, int(REGISTERED * 1e6)]

    def _counted(self, reply: Any) -> None:
        if isinstance(reply, int):
            self._fallback.replicas = max(reply, 1)
            self.metrics.replicas.set(self._fallback.replicas)

    async def _probe(self) -> None:
        """While Redis is unreachable: one heartbeat; if it answers, limits are shared again."""
        self._probe_at = time.monotonic() + self._settings.probe_interval
        sha, keys, args = self._heartbeat()
        try:
            reply = await self._scripts[sha](keys=keys, args=args)
        except REDIS_ERRORS:
            self.metrics.errors.inc()
            return
        self._beat_at = time.monotonic() + HEARTBEAT_INTERVAL
        self._counted(reply)
        self._recovered()

    def _ask_again(self, asks: list[Ask]) -> None:
        """A round that timed out, short of an outage: its calls' grants go in the next
        round. Units the lost answer may have granted stay charged (a retry never makes
        room: only what the call needs is asked again); what it gave back is not given
        back twice. Top-ups are dropped (the next call asks again)."""
        again = []
        for ask in asks:
            if ask.done is None or ask.done.done():
                self._reject(ask, RedisTimeout("limits round timed out"))
                continue
            ask.buckets = [(need, more, 0, took) for need, more, _, took in ask.buckets]
            again.append(ask)
        if again:
            self._asks[:0] = again
            self._calls_waiting = True

    async def _run(self, commands: list[tuple[str, list[str], list[Any]]]) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for sha, keys, args in commands:
                pipe.evalsha(sha, len(keys), *keys, *args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):  # Redis restarted: load it again
                sha, keys, args = commands[i]
                replies[i] = await self._scripts[sha](keys=keys, args=args)
        return replies

    def _apply(self, ask: Ask, marks: list[int], reply: Any, now: float) -> None:
        """A grant's answer: leases, spend views, then the waiting call (if it still waits)."""
        if isinstance(reply, Exception):
            self._failed(reply)
            self._reject(ask, reply)
            return
        if ask.done is None:
            ask.shape.refreshing = False
        nums = [int(x) for x in reply.split(b",")]
        code, n = nums[0], len(ask.buckets)
        for i, (_, _, _, lease) in enumerate(ask.shape.buckets):
            granted, remaining, reset = nums[3 + 3 * i : 6 + 3 * i]
            _, more, _, took = ask.buckets[i]
            if more:
                lease.asking = False
            if code != 0:
                lease.held += took  # the call was refused: nothing it took is spent
            lease.granted(granted, remaining, reset / 1e6, now, self._period)
        for j, (_, _, view) in enumerate(ask.shape.budgets):
            view.base, view.mark, view.read_at = nums[3 + 3 * n + j], marks[j], now
            view.judge()
        if ask.done is not None and not ask.done.done():
            ask.done.set_result(nums[:3])

    def _reject(self, ask: Ask, exc: BaseException) -> None:
        """A grant that failed: its top-ups are no longer on their way, its call passes
        (what it took from its leases stays spent)."""
        if ask.done is None:
            ask.shape.refreshing = False
        elif not ask.done.done():
            ask.done.set_exception(exc)
        for (_, _, _, lease), (_, more, _, _) in zip(ask.shape.buckets, ask.buckets, strict=True):
            if more:
                lease.asking = False

    def _fail_asks(self, exc: BaseException) -> None:
        asks, self._asks = self._inflight + self._asks, []
        for ask in asks:
            self._reject(ask, exc)

    def _fold(self) -> None:
        """What the shapes owe, as settles (merged per set of keys, as every settle is)."""
        shapes, self._due = self._due, []
        for shape in shapes:
            shape.due = False
            charges: list[tuple[str, int, int]] = []
            for key, _, _, lease in shape.buckets:  # request buckets owe after an outage
                if lease.due:
                    charges.append((key, lease.due, lease.limit))
                    lease.due = 0
            units, shape.units_due = shape.units_due, 0
            if charges or units:
                keys = (*(key for key, _, _ in charges), *shape.spend_keys)
                self._add(keys, charges, units, shape.period_ids if units else ())

    def _return_leases(self, force: bool) -> None:
        """Give back what aged out unspent (everything, at shutdown): every lease is looked
        at, so the sender does this at most twice a lease period."""
        now = self._last_sweep = time.monotonic()
        for shape in self._shapes.values():  # pockets past their time: back to the leases
            if force or shape.until <= now:
                shape.empty()
        for key, lease in self._leases.items():
            if lease.held and not lease.asking and (force or not lease.live(now)):
                self._add((key,), [(key, -lease.held, lease.limit)], 0, ())
                lease.held = 0

    def _add(
        self,
        keys: tuple[str, ...],
        charges: list[tuple[str, int, int]],
        units: int,
        period_ids: tuple[str, ...],
    ) -> None:
        """Queue a settle (SETTLE's arguments), merged into one already waiting for the
        same keys: under load most settles are an addition here."""
        waiting = self._pending.get(keys)
        if waiting is not None:  # the sender knows: no need to wake it again
            for i, (_, amount, _) in enumerate(charges):
                waiting[1 + 2 * i] += amount
            waiting[1 + 2 * len(charges)] += units
            return
        if len(self._pending) < self._settings.queue_size:
            args: list[Any] = [len(charges)]
            for _, amount, limit in charges:
                args += (amount, limit)
            args.append(units)
            args += [self._ttl(pid) for pid in period_ids]
            self._pending[keys] = args
        else:
            self.metrics.dropped.inc()
            return
        self._settle_soon()

    def _settle_soon(self) -> None:
        """Settles wait: not idle, and the sender goes by the settle interval."""
        self._idle.clear()
        self._wake_by(self._last_settle + self._settings.settle_interval)

    def _wake_by(self, at: float) -> None:
        """Wake the sender only if it would sleep past ``at`` (never from within the
        sender itself: it is awake)."""
        if self._sleep_until > at:
            self._wake.set()

    # -- names, TTLs and health ----------------------------------------------------------

    def _ttl(self, period_id: str) -> int:
        """Seconds a counter lives: its period and a day more (so a late settle still lands)."""
        gone = self._expiry.get(period_id)
        if gone is None:
            if len(self._expiry) > 64:
                self._expiry.clear()
            period = "day" if period_id.startswith("d") else "month"
            gone = period_end(period, datetime.now(UTC)).timestamp() + 86400
            self._expiry[period_id] = gone
        return max(math.ceil(gone - time.time()), 1)

    def _shape(self, plan: Plan) -> Shape:
        """The plan's keys, leases and views, built once per plan (key and day). Found by
        identity: hashing a plan costs more than the rest of a local answer, and the stage
        hands out the same Plan object for a key all day (the shape keeps it: its id stays)."""
        shape = self._shapes.get(id(plan))
        if shape is None or shape.plan is not plan:
            if len(self._shapes) >= SHAPES:
                self._forget()
            shape = self._shapes[id(plan)] = self._new_shape(plan)
        return shape

    def _new_shape(self, plan: Plan) -> Shape:
        buckets = tuple(
            (key, b, b.kind == "tokens", self._lease(key, b.limit))
            for b in plan.buckets
            for key in (self._bucket(plan.tag, b),)
        )
        spend_keys = tuple(self._counter(plan.tag, c) for c in plan.counters)
        budgets = tuple(
            (key, b, self._views.setdefault(key, SpendView()))
            for b in plan.budgets
            for key in (self._counter(plan.tag, b.counter),)
        )  # only counters with a budget have a view: the others are only ever written
        for _, b, view in budgets:
            view.limit = b.limit
            view.judge()
        return Shape(
            plan=plan,
            buckets=buckets,
            budgets=budgets,
            tpm=tuple((key, lease) for key, _, tokens, lease in buckets if tokens),
            spend=tuple(view for _, _, view in budgets),
            spend_keys=spend_keys,
            period_ids=tuple(c.period_id for c in plan.counters),
            grant_keys=[key for key, *_ in buckets] + [key for key, *_ in budgets],
        )

    def _lease(self, key: str, limit: int) -> Lease:
        """The bucket's lease (a new one when its limit changed: the old one's units go back)."""
        lease = self._leases.get(key)
        if lease is None or lease.limit != limit:
            if lease is not None:  # (rare) the old lease's units, pockets included, go back
                for shape in self._shapes.values():
                    shape.empty()
            if lease is not None and lease.held:
                self._add((key,), [(key, -lease.held, lease.limit)], 0, ())
                lease.held = 0
            lease = self._leases[key] = Lease(limit)
        return lease

    def _forget(self) -> None:
        """Bound the per-key state: shapes, leases (their units go back first) and views
        start afresh. Grants on their way land in the old objects and are lost, which only
        keeps their units away until the buckets refill."""
        self._return_leases(force=True)
        self._shapes.clear()
        self._leases.clear()
        self._views.clear()

    def _bucket(self, tag: str, b: Bucket) -> str:
        return f"{self._prefix}rl:{{{tag}}}:{b.scope}:{b.owner}:{b.kind}"

    def _counter(self, tag: str, c: Counter) -> str:
        return f"{self._prefix}spend:{{{tag}}}:{c.scope}:{c.owner}:{c.period_id}"

    def _failed(self, exc: BaseException) -> bool:
        """Count a failure; True when it makes (or finds) an outage: a real failure, or
        the limits.outage_after-th timeout in a row."""
        self.metrics.errors.inc()
        if self._down:
            return True
        if isinstance(exc, TIMEOUTS):
            self._timeouts += 1
            if self._timeouts < self._limits.outage_after:
                log.info("limits: a Redis round timed out (%d in a row); sending it again",
                         self._timeouts)  # fmt: skip
                return False
        self._timeouts = 0
        self._down = True
        self._probe_at = time.monotonic() + self._settings.probe_interval
        self._fallback.begin()
        self.metrics.degraded.labels(self._fallback.mode).set(1)
        self._fail_asks(exc)  # nothing goes to Redis until a probe finds it
        log.warning("limits: Redis is unreachable (%s: %s); until it answers again, %s",
                    type(exc).__name__, exc, self._fallback.describe())  # fmt: skip
        return True

    def _recovered(self) -> None:
        if self._down:
            self._down = False
            self._timeouts = 0
            self.metrics.degraded.labels(self._fallback.mode).set(0)
            self._wake.set()  # the settles that waited go now
            log.warning("limits: Redis answers again; rate limits and budgets are shared")
