"""The shared limiter in Redis: every replica counts against the same buckets and budgets.

Keys (all start with ``redis.key_prefix``; ``{team}`` is a Redis Cluster hash tag, so every
key one call touches lives in its team's slot and one script can reach them all):

- ``rl:{T}:<scope>:<owner>:<kind>``: a bucket's theoretical arrival time (µs, Redis clock),
  expiring when the bucket is full again;
- ``spend:{T}:<scope>:<owner>:<period>``: spend in 1e-10 USD units (INCRBY: exact), expiring
  a day after its period.

A call's check is one EVALSHA (ADMIT); settles (token reconciliation and spend) are queued
and sent by one flusher task, many to a pipeline, off the request path; settles for the
same keys that wait together are merged into one (under load, one per key per flush).

When Redis fails, limits fail open: calls pass, a warning is logged once and
gateway_limits_errors counts; Redis is tried again every redis.probe_interval, so the
limiter recovers by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError, RedisError

from gateway.limits.base import ALLOW, Bucket, Counter, Plan, Seed, Verdict, Window, period_end
from gateway.limits.metrics import LimitMetrics
from gateway.settings import RedisSettings

log = logging.getLogger(__name__)

REDIS_ERRORS = (RedisError, OSError, TimeoutError)
SHAPES = 10_000
"""Plans whose key names are kept (one per active key and day)."""
BATCH = 256
"""Queued settles sent in one pipeline (redis.queue_size bounds how many may wait)."""

NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local W = 60000000
local function store(key, tat)
  if tat > now then
    redis.call('SET', key, string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
  else
    redis.call('DEL', key)
  end
end
local function tat_of(key)
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then return now end
  return tat
end
"""

# KEYS: n buckets, then budgets' counters. ARGV[1]: "n,limit,cost,...,budget,..." (one
# argument, and the reply one string: a fraction of the client's work for a dozen numbers).
# Reply: "code,which,wait" (code 0 ok, 1 bucket, 2 budget; which 1-based; wait µs, -1:
# never fits), then ",remaining,reset µs" per bucket. Budgets first, then buckets, as base.py.
ADMIT = (
    NOW
    + """
local a = {}
for v in string.gmatch(ARGV[1], '[^,]+') do a[#a + 1] = tonumber(v) end
local n = a[1]
local code, which, wait = 0, 0, 0
for j = n + 1, #KEYS do
  if tonumber(redis.call('GET', KEYS[j]) or '0') >= a[1 + n + j] then
    code, which = 2, j - n
    break
  end
end
local tats, news = {}, {}
for i = 1, n do
  local limit, cost = a[2 * i], a[2 * i + 1]
  tats[i] = tat_of(KEYS[i])
  news[i] = tats[i] + cost * W / limit
  if code == 0 and news[i] - now - W > 0.001 then
    code, which = 1, i
    if cost > limit then wait = -1 else wait = math.ceil(news[i] - now - W) end
  end
end
local out = {code, which, wait}
for i = 1, n do
  local tat = tats[i]
  if code == 0 then
    tat = news[i]
    store(KEYS[i], tat)
  end
  local step = W / a[2 * i]
  out[#out + 1] = math.max(math.floor((W - (tat - now)) / step + 1e-9), 0)
  out[#out + 1] = math.floor(tat - now)
end
for i = 1, #out do out[i] = string.format('%.0f', out[i]) end
return table.concat(out, ',')
"""
)

# KEYS: k token buckets, then spend counters. ARGV: k, tokens, limit per bucket, units,
# ttl seconds per counter.
SETTLE = (
    NOW
    + """
local k, tokens = tonumber(ARGV[1]), tonumber(ARGV[2])
if tokens ~= 0 then
  for i = 1, k do
    store(KEYS[i], tat_of(KEYS[i]) + tokens * W / tonumber(ARGV[2 + i]))
  end
end
local units = ARGV[3 + k]
if units ~= '0' then
  for j = k + 1, #KEYS do
    redis.call('INCRBY', KEYS[j], units)
    redis.call('EXPIRE', KEYS[j], ARGV[3 + j])
  end
end
"""
)


class RedisLimiter:
    def __init__(
        self, client: Redis | RedisCluster, settings: RedisSettings, metrics: LimitMetrics
    ) -> None:
        self._client = client
        self._prefix = settings.key_prefix
        self._settings = settings
        self.metrics = metrics
        self._admit = client.register_script(ADMIT)
        self._settle = client.register_script(SETTLE)
        self._pending: dict[tuple[str, ...], list[Any]] = {}
        self._expiry: dict[str, float] = {}
        """Period id -> epoch when its counters may go."""
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._admits: list[tuple[list[str], str, asyncio.Future[bytes]]] = []
        self._admit_wake = asyncio.Event()
        self._checker: asyncio.Task[None] | None = None
        self._shapes: dict[Plan, _Shape] = {}
        self._retry_at = 0.0
        self._degraded = False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._flusher(), name="limits-flusher")
        self._checker = asyncio.create_task(self._admitter(), name="limits-admitter")

    async def aclose(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            await asyncio.gather(self._checker, return_exceptions=True)
            self._checker = None
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.flush(), timeout=1.0)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._client.aclose()

    async def admit(self, plan: Plan, tokens: int) -> Verdict:
        if not (plan.buckets or plan.budgets) or time.monotonic() < self._retry_at:
            return ALLOW
        shape = self._shape(plan)
        done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._admits.append((shape.admit_keys, shape.admit_args.format(tokens), done))
        self._admit_wake.set()
        try:
            reply = await done
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return ALLOW
        self._recovered()
        return _verdict(plan, [int(x) for x in reply.split(b",")])

    def settle(self, plan: Plan, tokens: int, units: int) -> None:
        if not (tokens and plan.buckets) and not units:
            return
        shape = self._shape(plan)
        keys, k = shape.settle_keys[bool(tokens)][bool(units)], len(shape.tpm_limits)
        if not keys:
            return
        args: list[Any] = [k if tokens else 0, tokens, *(shape.tpm_limits if tokens else ()), units]
        if units:
            args += [self._ttl(pid) for pid in shape.period_ids]
        self._add(keys, args)
        self._idle.clear()
        self._wake.set()

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
        await self._idle.wait()

    async def _admitter(self) -> None:
        """Send the checks waiting now in one pipeline: concurrent calls share a round trip."""
        while True:
            await self._admit_wake.wait()
            self._admit_wake.clear()
            while self._admits:
                batch, self._admits = self._admits, []
                try:
                    await self._check(batch)
                except Exception as exc:
                    # This task must outlive any surprise, or every later check would hang.
                    log.exception("limits: check failed unexpectedly; letting the calls through")
                    _fail(batch, RedisError(f"limits check failed: {exc!r}"))

    async def _check(self, batch: list[tuple[list[str], str, asyncio.Future[bytes]]]) -> None:
        try:
            if len(batch) == 1:
                keys, arg, _ = batch[0]
                replies: list[Any] = [await self._admit(keys=keys, args=[arg])]
            else:
                async with self._client.pipeline(transaction=False) as pipe:
                    for keys, arg, _ in batch:
                        pipe.evalsha(self._admit.sha, len(keys), *keys, arg)
                    replies = await pipe.execute(raise_on_error=False)
                for i, reply in enumerate(replies):
                    if isinstance(reply, NoScriptError):  # Redis restarted: load it again
                        replies[i] = await self._admit(keys=batch[i][0], args=[batch[i][1]])
        except REDIS_ERRORS as exc:
            _fail(batch, exc)
            return
        for (_, _, done), reply in zip(batch, replies, strict=True):
            if done.done():
                continue  # its caller went away
            if isinstance(reply, Exception):
                done.set_exception(reply)
            else:
                done.set_result(reply)

    async def _flusher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                pending, self._pending = self._pending, {}
                items = list(pending.items())
                for i in range(0, len(items), BATCH):
                    try:
                        await self._send(items[i : i + BATCH])
                    except Exception:
                        log.exception("limits: settle failed unexpectedly; dropped")
            self._idle.set()

    def _add(self, keys: tuple[str, ...], args: list[Any]) -> None:
        """Queue a settle, merged into one already waiting for the same keys (same owner)."""
        waiting = self._pending.get(keys)
        if waiting is not None:
            k = args[0]
            waiting[1] += args[1]
            waiting[3 + k] += args[3 + k]
        elif len(self._pending) < self._settings.queue_size:
            self._pending[keys] = args
        else:
            self.metrics.dropped.inc()

    async def _send(self, batch: Sequence[tuple[tuple[str, ...], list[Any]]]) -> None:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for keys, args in batch:
                    await self._settle(keys=list(keys), args=args, client=pipe)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            # Dropped, not retried: a half-applied pipeline retried would count spend twice.
            self.metrics.dropped.inc(len(batch))
            self._failed(exc)

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

    def _shape(self, plan: Plan) -> _Shape:
        """The plan's key names and fixed arguments, built once per plan (key and day)."""
        shape = self._shapes.get(plan)
        if shape is None:
            if len(self._shapes) >= SHAPES:
                self._shapes.clear()
            shape = self._shapes[plan] = _Shape.of(plan, self._bucket, self._counter)
        return shape

    def _bucket(self, tag: str, b: Bucket) -> str:
        return f"{self._prefix}rl:{{{tag}}}:{b.scope}:{b.owner}:{b.kind}"

    def _counter(self, tag: str, c: Counter) -> str:
        return f"{self._prefix}spend:{{{tag}}}:{c.scope}:{c.owner}:{c.period_id}"

    def _failed(self, exc: BaseException) -> None:
        self.metrics.errors.inc()
        self._retry_at = time.monotonic() + self._settings.probe_interval
        if not self._degraded:
            self._degraded = True
            self.metrics.degraded.set(1)
            log.warning("limits: Redis failed (%s: %s); rate limits and budgets fail open "
                        "until it answers again", type(exc).__name__, exc)  # fmt: skip

    def _recovered(self) -> None:
        if self._degraded:
            self._degraded = False
            self.metrics.degraded.set(0)
            log.warning("limits: Redis answers again; rate limits and budgets are enforced")


@dataclass(slots=True, frozen=True)
class _Shape:
    admit_keys: list[str]
    admit_args: str
    """"n,limit,cost,...,budget,..." with {0} where the call's tokens go."""
    settle_keys: tuple[tuple[tuple[str, ...], ...], ...]
    """[has tokens][has spend]: token bucket keys then counter keys."""
    tpm_limits: tuple[int, ...]
    period_ids: tuple[str, ...]

    @classmethod
    def of(
        cls,
        plan: Plan,
        bucket: Callable[[str, Bucket], str],
        counter: Callable[[str, Counter], str],
    ) -> _Shape:
        nums = [str(len(plan.buckets))]
        for b in plan.buckets:
            nums += (str(b.limit), "1" if b.kind == "requests" else "{0}")
        nums += [str(b.limit) for b in plan.budgets]
        tpm = tuple(b for b in plan.buckets if b.kind == "tokens")
        tpm_keys = tuple(bucket(plan.tag, b) for b in tpm)
        spend_keys = tuple(counter(plan.tag, c) for c in plan.counters)
        return cls(
            admit_keys=[bucket(plan.tag, b) for b in plan.buckets]
            + [counter(plan.tag, b.counter) for b in plan.budgets],
            admit_args=",".join(nums),
            settle_keys=(((), spend_keys), (tpm_keys, tpm_keys + spend_keys)),
            tpm_limits=tuple(b.limit for b in tpm),
            period_ids=tuple(c.period_id for c in plan.counters),
        )


def _fail(batch: Sequence[tuple[list[str], str, asyncio.Future[bytes]]], exc: Exception) -> None:
    for _, _, done in batch:
        if not done.done():
            done.set_exception(exc)


def _verdict(plan: Plan, reply: list[int]) -> Verdict:
    code, which, wait = reply[0], reply[1], reply[2]
    windows = tuple(
        Window(b, reply[3 + 2 * i], reply[4 + 2 * i] / 1e6) for i, b in enumerate(plan.buckets)
    )
    if code == 0:
        return Verdict(True, windows)
    if code == 2:
        return Verdict(False, windows, plan.budgets[which - 1], None)
    return Verdict(False, windows, plan.buckets[which - 1], None if wait < 0 else wait / 1e6)
