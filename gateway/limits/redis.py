"""The shared limiter in Redis: every replica counts against the same buckets and budgets.

Keys (all start with ``redis.key_prefix``; ``{team}`` is a Redis Cluster hash tag, so every
key one call touches lives in its team's slot and one script can reach them all):

- ``rl:{T}:<scope>:<owner>:<kind>``: a bucket's theoretical arrival time (µs, Redis clock),
  expiring when the bucket is full again;
- ``spend:{T}:<scope>:<owner>:<period>``: spend in 1e-10 USD units (INCRBY: exact), expiring
  a day after its period.

A call's check is one EVALSHA (ADMIT); settles (token reconciliation and spend) are queued
and sent by one flusher task, many to a pipeline, off the request path. When Redis fails,
limits fail open: calls pass, a warning is logged once and gateway_limits_errors counts;
Redis is tried again every redis.probe_interval, so the limiter recovers by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from gateway.limits.base import ALLOW, Bucket, Counter, Plan, Seed, Verdict, Window, period_end
from gateway.limits.metrics import LimitMetrics
from gateway.settings import RedisSettings

log = logging.getLogger(__name__)

REDIS_ERRORS = (RedisError, OSError, TimeoutError)
BATCH = 256
"""Queued settles sent in one pipeline."""

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

# KEYS: n buckets, then budgets' counters. ARGV: n, (limit, cost) per bucket, budget limits.
# Reply: code (0 ok, 1 bucket, 2 budget), which (1-based), wait µs (-1: never fits),
# then (remaining, reset µs) per bucket. Budgets first, then buckets, as base.py.
ADMIT = (
    NOW
    + """
local n = tonumber(ARGV[1])
local code, which, wait = 0, 0, 0
for j = n + 1, #KEYS do
  if tonumber(redis.call('GET', KEYS[j]) or '0') >= tonumber(ARGV[1 + 2 * n + j - n]) then
    code, which = 2, j - n
    break
  end
end
local tats, news = {}, {}
for i = 1, n do
  local limit, cost = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
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
  local step = W / tonumber(ARGV[2 * i])
  out[#out + 1] = math.max(math.floor((W - (tat - now)) / step + 1e-9), 0)
  out[#out + 1] = math.floor(tat - now)
end
return out
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
        self._queue: deque[tuple[list[str], list[Any]]] = deque(maxlen=settings.queue_size)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        self._degraded = False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._flusher(), name="limits-flusher")

    async def aclose(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.flush(), timeout=1.0)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._client.aclose()

    async def admit(self, plan: Plan) -> Verdict:
        if not (plan.buckets or plan.budgets) or time.monotonic() < self._retry_at:
            return ALLOW
        keys = [self._bucket(plan.tag, b) for b in plan.buckets]
        keys += [self._counter(plan.tag, b.counter) for b in plan.budgets]
        args: list[Any] = [len(plan.buckets)]
        for b in plan.buckets:
            args += [b.limit, b.cost]
        args += [b.limit for b in plan.budgets]
        try:
            reply = await self._admit(keys=keys, args=args)
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return ALLOW
        self._recovered()
        return _verdict(plan, [int(x) for x in reply])

    def settle(self, plan: Plan, tokens: int, units: int) -> None:
        tpm = [b for b in plan.buckets if b.kind == "tokens"] if tokens else []
        counters = plan.counters if units else ()
        if not (tpm or counters):
            return
        now = datetime.now(UTC)
        keys = [self._bucket(plan.tag, b) for b in tpm]
        keys += [self._counter(plan.tag, c) for c in counters]
        args: list[Any] = [len(tpm), tokens, *(b.limit for b in tpm), units]
        args += [_ttl(c, now) for c in counters]
        self._queue.append((keys, args))
        self._idle.clear()
        self._wake.set()

    async def seed(self, seeds: Iterable[Seed]) -> None:
        now = datetime.now(UTC)
        async with self._client.pipeline(transaction=False) as pipe:
            for s in seeds:
                ttl = max(int((s.ends - now).total_seconds()) + 86400, 1)
                pipe.set(self._counter(s.tag, s.counter), s.units, nx=True, ex=ttl)
            await pipe.execute()

    async def flush(self) -> None:
        await self._idle.wait()

    async def _flusher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                await self._send(batch)
            self._idle.set()

    async def _send(self, batch: Sequence[tuple[list[str], list[Any]]]) -> None:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for keys, args in batch:
                    await self._settle(keys=keys, args=args, client=pipe)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            # Dropped, not retried: a half-applied pipeline retried would count spend twice.
            self.metrics.dropped.inc(len(batch))
            self._failed(exc)

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


def _ttl(counter: Counter, now: datetime) -> int:
    """A counter outlives its period by a day (so a late settle still lands)."""
    period = "day" if counter.period_id.startswith("d") else "month"
    return math.ceil((period_end(period, now) - now).total_seconds()) + 86400
