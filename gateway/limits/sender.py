"""The Redis limiter's sender: the one task that talks to Redis, a pipeline per round.

Every pipeline carries the grants asked for since the last one (concurrent calls share a
round trip) and, before them, every settle waiting (settles.py), so a grant's read of a
counter includes all of this replica's spend sent so far. Settles go at most every
``redis.settle_interval``. A round costs the gateway real CPU, so the sender is woken
only when it must be: a call waiting on a grant goes at once; a top-up (no call
waits on it) rides with the next round of settles if that comes within a quarter of
``lease_period``, else goes then; under load the sender wakes at the settle interval by
itself, so a call's settle never wakes it.

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
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from gateway.limits.lease import Ask, Shape
from gateway.limits.lua import GRANT, HEARTBEAT, OK, SETTLE, Charge, grant_args, parse_grant
from gateway.limits.metrics import LimitMetrics
from gateway.limits.outage import HEARTBEAT as HEARTBEAT_INTERVAL
from gateway.limits.outage import REGISTERED, Fallback
from gateway.limits.settles import Settles
from gateway.settings import LimitsSettings, RedisSettings

log = logging.getLogger(__name__)

REDIS_ERRORS = (RedisError, OSError, TimeoutError)
TIMEOUTS = (RedisTimeout, TimeoutError)
"""A round that took too long: Redis may only be slow (or this loop busy), not gone."""

Command = tuple[str, list[str], list[Any]]
"""A script's sha, its keys and its arguments."""


class Sender:
    def __init__(
        self,
        client: Redis | RedisCluster,
        settings: RedisSettings,
        limits: LimitsSettings,
        metrics: LimitMetrics,
        fallback: Fallback,
        sweep: Callable[[bool], None],
    ) -> None:
        """``sweep(force)`` gives back the leases' units that aged out (all, if forced).
        Long only because the sender's state is all set, and documented, here."""
        self._client = client
        self._settings = settings
        self._limits = limits
        self._period = settings.lease_period
        self._metrics = metrics
        self._fallback = fallback
        self._sweep = sweep
        scripts = [client.register_script(script) for script in (GRANT, SETTLE, HEARTBEAT)]
        self._scripts = {s.sha: s for s in scripts}
        self._grant_sha, self._settle_sha, self._beat_sha = (s.sha for s in scripts)
        self._replica = uuid.uuid4().hex
        self._replicas_key = f"{settings.key_prefix}limits:replicas"
        self._settles = Settles(settings.queue_size, metrics)
        self._asks: list[Ask] = []
        self._inflight: list[Ask] = []
        """The grants of the round on its way (failed with it if it fails unexpectedly)."""
        self._task: asyncio.Task[None] | None = None
        # When to go: woken by an event, or by itself at the earliest of these times.
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._urgent = False
        """Send the settles now (a spent budget, a flush), not at the settle interval."""
        self._calls_waiting = False
        """An ask in ``_asks`` has a call waiting on it: the next round goes at once."""
        self._topup_by = math.inf
        """When the earliest top-up in ``_asks`` must go at the latest."""
        self._sleep_until = math.inf
        """When the sender wakes by itself (monotonic): an event due later must wake it."""
        self._last_settle = 0.0
        self._last_sweep = 0.0
        self._beat_at = 0.0
        """When the next heartbeat is due (monotonic): the first round carries one."""
        # Outages.
        self.down = False
        """Redis is unreachable: calls get the fallback's answer, the sender only probes."""
        self._probe_at = 0.0
        self._timeouts = 0
        """Rounds in a row that timed out (limits.outage_after of them: an outage)."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="limits-sender")

    async def stop(self) -> None:
        """Land the grants on their way, give every lease back, then deregister."""
        if self._task is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.flush(), timeout=0.5)
            self._sweep(True)
            await asyncio.wait_for(self.flush(), timeout=0.5)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        if not self.down:  # no longer one of the replicas sharing the limits
            with contextlib.suppress(*REDIS_ERRORS):
                await self._client.zrem(self._replicas_key, self._replica)

    async def flush(self) -> None:
        """Send everything waiting (settles and top-ups) now, and wait until it landed
        (at once while Redis is unreachable: the settles wait for it)."""
        if self.down:
            return
        if self._asks:
            self._idle.clear()
        if not self._idle.is_set():
            self._urgent = True
            self._wake.set()
        await self._idle.wait()

    def ask(self, ask: Ask, now: float) -> None:
        """Queue a grant: a call's goes in the next round, at once; a top-up may wait a
        quarter period for a round that goes anyway."""
        self._asks.append(ask)
        if ask.done is not None:
            self._calls_waiting = True
            self._wake.set()
        else:
            self._topup_by = min(self._topup_by, now + self._period / 4)
            self._wake_by(self._topup_by)

    def owe(self, shape: Shape) -> None:
        """The shape has something to settle: the next round folds it in."""
        if self._settles.owe(shape):
            self._settle_soon()

    def settle(
        self, keys: tuple[str, ...], charges: list[Charge], units: int, period_ids: tuple[str, ...]
    ) -> None:
        if self._settles.add(keys, charges, units, period_ids):
            self._settle_soon()

    def urge(self) -> None:
        """A budget was spent here: the settle that says so reaches the others now."""
        self._urgent = True
        self._wake.set()

    def _settle_soon(self) -> None:
        """Settles wait: not idle, and the sender goes by the settle interval."""
        self._idle.clear()
        self._wake_by(self._last_settle + self._settings.settle_interval)

    def _wake_by(self, at: float) -> None:
        """Wake the sender only if it would sleep past ``at`` (never from within the
        sender itself: it is awake)."""
        if self._sleep_until > at:
            self._wake.set()

    # -- the loop ----------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_round()):
                    await self._wake.wait()
            self._sleep_until = -math.inf  # awake: nobody needs to wake it
            self._wake.clear()
            if self.down:
                if time.monotonic() >= self._probe_at:
                    await self._probe()
                continue
            if time.monotonic() - self._last_sweep >= self._period / 2:
                self._last_sweep = time.monotonic()
                self._sweep(False)
            while self._round_due():
                try:
                    await self._round()
                except Exception as exc:
                    # This task must outlive any surprise, or every later check would hang.
                    log.exception("limits: a round failed unexpectedly; letting the calls through")
                    self._fail_asks(RedisError(f"limits round failed: {exc!r}"))
                self._inflight = []
            if not self._settles:
                self._urgent = False
                self._idle.set()

    def _next_round(self) -> float:
        """Seconds until the next round is due: settles waiting (or, after a round of
        settles, those the calls will owe by then: under load the sender is not woken for
        them), the earliest top-up waiting, or the sweep for leases that aged out."""
        now = time.monotonic()
        if self.down:
            self._sleep_until = self._probe_at
            return max(self._probe_at - now, 0.0)
        settles = self._last_settle + self._settings.settle_interval
        at = min(now + self._period / 2, self._topup_by, self._beat_at)
        if self._settles or settles > now:
            at = min(at, settles)
        self._sleep_until = at
        return max(at - now, 0.0)

    def _round_due(self) -> bool:
        if self.down:
            return False
        if self._calls_waiting or (self._asks and self._urgent):
            return True
        now = time.monotonic()
        if (self._asks and now >= self._topup_by) or now >= self._beat_at:
            return True
        if not self._settles:
            return False
        return self._urgent or now - self._last_settle >= self._settings.settle_interval

    async def _round(self) -> None:
        """Settles first, so the grants' reads of the counters include them."""
        asks = self._inflight = self._asks
        self._asks, self._calls_waiting, self._topup_by = [], False, math.inf
        settles = self._settles.take()
        if settles:
            self._last_settle = time.monotonic()
        commands: list[Command] = [(self._settle_sha, list(s.keys), s.args()) for s in settles]
        for ask in asks:
            ask.marks = [b.view.own for b in ask.shape.budgets]
            commands.append((self._grant_sha, ask.shape.grant_keys, [grant_args(ask)]))
        beat = time.monotonic() >= self._beat_at
        if beat:
            self._beat_at = time.monotonic() + HEARTBEAT_INTERVAL
            commands.append(self._heartbeat())
        try:
            replies = await self._run(commands)
        except REDIS_ERRORS as exc:
            # Settles are dropped, not retried: a half-applied pipeline retried counts twice.
            self._metrics.dropped.inc(len(settles))
            if beat:
                self._beat_at = 0.0
            if not self.fail(exc):
                self._ask_again(asks)
            return
        self._timeouts = 0
        self._metrics.dropped.inc(sum(isinstance(r, Exception) for r in replies[: len(settles)]))
        if beat:
            self._counted(replies.pop())
        now = time.monotonic()
        for ask, reply in zip(asks, replies[len(settles) :], strict=True):
            self._apply(ask, reply, now)

    async def _run(self, commands: list[Command]) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for sha, keys, args in commands:
                pipe.evalsha(sha, len(keys), *keys, *args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):  # Redis restarted: load it again
                sha, keys, args = commands[i]
                replies[i] = await self._scripts[sha](keys=keys, args=args)
        return replies

    # -- what a round's answers do -----------------------------------------------------

    def _apply(self, ask: Ask, reply: Any, now: float) -> None:
        """A grant's answer: leases, spend views, then the waiting call (if it still waits)."""
        if isinstance(reply, Exception):
            self.fail(reply)
            self._reject(ask, reply)
            return
        if ask.done is None:
            ask.shape.refreshing = False
        granted = parse_grant(reply, len(ask.takes))
        for b, take, grant in zip(ask.shape.buckets, ask.takes, granted.buckets, strict=True):
            if take.extra:
                b.lease.asking = False
            if granted.code != OK:
                b.lease.held += take.took  # the call was refused: nothing it took is spent
            b.lease.granted(grant.units, grant.remaining, grant.reset, now, self._period)
        for v, mark, spend in zip(ask.shape.budgets, ask.marks, granted.spend, strict=True):
            v.view.base, v.view.mark, v.view.read_at = spend, mark, now
        if ask.done is not None and not ask.done.done():
            ask.done.set_result(granted)

    def _reject(self, ask: Ask, exc: BaseException) -> None:
        """A grant that failed: its top-ups are no longer on their way, its call passes
        (what it took from its leases stays spent)."""
        if ask.done is None:
            ask.shape.refreshing = False
        elif not ask.done.done():
            ask.done.set_exception(exc)
        for b, take in zip(ask.shape.buckets, ask.takes, strict=True):
            if take.extra:
                b.lease.asking = False

    def _fail_asks(self, exc: BaseException) -> None:
        asks, self._asks = self._inflight + self._asks, []
        for ask in asks:
            self._reject(ask, exc)

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
            for take in ask.takes:
                take.give = 0
            again.append(ask)
        if again:
            self._asks[:0] = again
            self._calls_waiting = True

    # -- health: heartbeats, outages, probes -------------------------------------------

    def _heartbeat(self) -> Command:
        """Register this replica and count those registered (HEARTBEAT's arguments)."""
        return self._beat_sha, [self._replicas_key], [self._replica, int(REGISTERED * 1e6)]

    def _counted(self, reply: Any) -> None:
        if isinstance(reply, int):
            self._fallback.replicas = max(reply, 1)
            self._metrics.replicas.set(self._fallback.replicas)

    async def _probe(self) -> None:
        """While Redis is unreachable: one heartbeat; if it answers, limits are shared again."""
        self._probe_at = time.monotonic() + self._settings.probe_interval
        sha, keys, args = self._heartbeat()
        try:
            reply = await self._scripts[sha](keys=keys, args=args)
        except REDIS_ERRORS:
            self._metrics.errors.inc()
            return
        self._beat_at = time.monotonic() + HEARTBEAT_INTERVAL
        self._counted(reply)
        self._recovered()

    def fail(self, exc: BaseException) -> bool:
        """Count a failure; True when it makes (or finds) an outage: a real failure, or
        the limits.outage_after-th timeout in a row."""
        self._metrics.errors.inc()
        if self.down:
            return True
        if isinstance(exc, TIMEOUTS):
            self._timeouts += 1
            if self._timeouts < self._limits.outage_after:
                log.info("limits: a Redis round timed out (%d in a row); sending it again",
                         self._timeouts)  # fmt: skip
                return False
        self._timeouts = 0
        self.down = True
        self._probe_at = time.monotonic() + self._settings.probe_interval
        self._fallback.begin()
        self._metrics.degraded.labels(self._fallback.mode).set(1)
        self._fail_asks(exc)  # nothing goes to Redis until a probe finds it
        log.warning("limits: Redis is unreachable (%s: %s); until it answers again, %s",
                    type(exc).__name__, exc, self._fallback.describe())  # fmt: skip
        return True

    def _recovered(self) -> None:
        if self.down:
            self.down = False
            self._timeouts = 0
            self._metrics.degraded.labels(self._fallback.mode).set(0)
            self._wake.set()  # the settles that waited go now
            log.warning("limits: Redis answers again; rate limits and budgets are shared")
