"""Redis slow or away: a timeout is not an outage; an outage does what limits.on_outage says.

Each test runs its own redis-server (tests/integration/index/redis_servers.py) to kill
or freeze; the machine's Redis is never touched.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from gateway.limits.base import Bucket, Budget, Counter, Plan, Seed, period_id
from gateway.limits.redis import RedisLimiter
from gateway.settings import LimitsSettings
from tests.integration.index.redis_servers import RedisProcess
from tests.integration.limits.conftest import redis_limiter
from tests.polling import eventually


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    """A private redis-server, not yet started (killed afterwards, even if frozen)."""
    proc = RedisProcess()
    yield proc
    proc.kill()


def limiter_on(
    server: RedisProcess, registry: CollectorRegistry, prefix: str = "gwtest:outage:", **limits: Any
) -> RedisLimiter:
    url = f"redis://127.0.0.1:{server.port}/0"
    return redis_limiter(url, prefix, registry, LimitsSettings(**limits), probe_interval=0.2)


def degraded(registry: CollectorRegistry, mode: str) -> float | None:
    return registry.get_sample_value("gateway_limits_degraded", {"mode": mode})


def rpm(limit: int) -> Plan:
    return Plan("t", (Bucket("key", "requests", "k", limit),), (), ())


async def served(admit: Callable[[], Awaitable[bool]], at_most: int) -> int:
    n = 0
    while n < at_most and await admit():
        n += 1
    return n


async def test_open_lets_every_call_pass_without_waiting_then_recovers(
    server: RedisProcess,
) -> None:
    registry = CollectorRegistry()
    limiter = limiter_on(server, registry, on_outage="open")
    await limiter.start()
    try:
        for _ in range(3):  # nothing listens: every call passes, no call waits on Redis
            started = time.monotonic()
            assert (await limiter.admit(rpm(1), 0)).allowed
            assert time.monotonic() - started < 0.5
        assert degraded(registry, "open") == 1
        await limiter.seed([Seed(Counter("key", "k", "d1"), "t", 5, datetime.now(UTC))])
        server.start()
        await eventually(lambda: degraded(registry, "open") == 0)  # the probe found it
        plan = rpm(1)
        assert (await limiter.admit(plan, 0)).allowed
        assert not (await limiter.admit(plan, 0)).allowed  # shared and enforced again
    finally:
        await limiter.aclose()


async def test_closed_refuses_limited_calls_and_passes_the_others(server: RedisProcess) -> None:
    registry = CollectorRegistry()
    limiter = limiter_on(server, registry, on_outage="closed")
    await limiter.start()
    try:
        verdict = await limiter.admit(rpm(1000), 0)
        assert not verdict.allowed
        assert verdict.refused_by is None  # the stage's 503
        assert verdict.retry_after == 0.2
        assert (await limiter.admit(Plan("t", (), (), ()), 0)).allowed  # nothing to enforce
        assert degraded(registry, "closed") == 1
        server.start()
        await eventually(lambda: degraded(registry, "closed") == 0)
        assert (await limiter.admit(rpm(1000), 0)).allowed
    finally:
        await limiter.aclose()


async def test_local_shares_hold_across_replicas_and_shared_limits_resume(
    server: RedisProcess,
) -> None:
    """Two replicas at rpm 60: 30 each while Redis is away, starting from what the shared
    bucket held; once it is back (a fresh Redis: a full bucket), it is charged with what
    the shares let through, so 60 between the outage and after it."""
    server.start()
    registries = [CollectorRegistry(), CollectorRegistry()]
    pair = [limiter_on(server, r) for r in registries]
    for limiter in pair:
        await limiter.start()
    plans = [rpm(60), rpm(60)]  # one plan object per replica, as each builds its own
    try:
        await eventually(lambda: all(r.get_sample_value("gateway_limits_replicas") == 2
                                     for r in registries))  # fmt: skip
        started = time.monotonic()
        for _ in range(10):  # in turn, so both know what the shared bucket holds
            for i in (0, 1):
                assert await _allowed(pair[i], plans[i])
        # 40 of 60 left in the shared bucket (less what the leases hold): 20 for each
        server.kill()
        during = [await served(functools.partial(_allowed, pair[i], plans[i]), 100) for i in (0, 1)]
        for r in registries:
            assert degraded(r, "local") == 1
        refilled = math.ceil((time.monotonic() - started) * 0.5) + 1  # 30 a minute each
        for n in during:
            assert 18 <= n <= 21 + refilled  # its share of what was left, and its lease's unit
        assert 20 + sum(during) <= 60 + 2 * refilled
        server.start()  # empty again: a full bucket of 60, less what the outage took
        await eventually(lambda: all(degraded(r, "local") == 0 for r in registries))
        restarted = time.monotonic()
        for limiter in pair:
            await limiter.flush()  # the outage's charges land
        after = [await served(functools.partial(_allowed, pair[i], plans[i]), 100) for i in (0, 1)]
        # (and a unit each may still hold from a lease granted before the outage)
        total = sum(during) + sum(after)
        assert 60 <= total <= 62 + math.ceil(time.monotonic() - restarted), (during, after)
    finally:
        for limiter in pair:
            await limiter.aclose()


async def test_tokens_admitted_by_local_shares_are_charged_once_redis_is_back(
    server: RedisProcess,
) -> None:
    """tpm 6,000 (100 tokens a second): a call admitted for 100 tokens during the outage
    that settles at 150 leaves the shared bucket 150 tokens (1.5 s of refill) in debt."""
    registry = CollectorRegistry()
    limiter = limiter_on(server, registry, prefix="gwtest:tpm:")
    await limiter.start()
    plan = Plan("t", (Bucket("key", "tokens", "k", 6000),), (), ())
    try:
        assert (await limiter.admit(plan, 100)).allowed  # nothing listens: a local share
        assert degraded(registry, "local") == 1
        limiter.settle(plan, 50, 0)  # it used 150
        server.start()
        await eventually(lambda: degraded(registry, "local") == 0)
        await limiter.flush()
        direct = redis.Redis(port=server.port)
        owed_ms = direct.pttl("gwtest:tpm:rl:{t}:key:k:tokens")
        direct.close()
        assert 1000 < owed_ms <= 1501
    finally:
        await limiter.aclose()


async def test_local_budget_share_is_a_share_of_what_was_left(server: RedisProcess) -> None:
    server.start()
    registry = CollectorRegistry()
    limiter = limiter_on(server, registry, prefix="gwtest:budget:")
    await limiter.start()
    counter = Counter("key", "k", period_id("day", datetime.now(UTC)))
    plan = Plan("t", (), (Budget(counter, 100, datetime.now(UTC)),), (counter,))
    try:
        assert (await limiter.admit(plan, 0)).allowed
        limiter.settle(plan, 0, 40)
        await limiter.flush()
        server.kill()
        limiter.settle(plan, 0, 10)
        await limiter.flush()  # its round finds Redis gone (those 10 are lost to Redis)
        assert degraded(registry, "local") == 1
        assert (await limiter.admit(plan, 0)).allowed  # alone: the 50 left are its share
        limiter.settle(plan, 0, 49)
        assert (await limiter.admit(plan, 0)).allowed
        limiter.settle(plan, 0, 1)
        verdict = await limiter.admit(plan, 0)
        assert not verdict.allowed
        assert verdict.refused_by == plan.budgets[0]
        server.start()  # a new, empty Redis: what was settled meanwhile reaches it
        await eventually(lambda: degraded(registry, "local") == 0)
        await limiter.flush()
        direct = redis.Redis(port=server.port)
        assert direct.get(f"gwtest:budget:spend:{{t}}:key:k:{counter.period_id}") == b"50"
        direct.close()
    finally:
        await limiter.aclose()


async def test_a_timeout_is_not_an_outage(server: RedisProcess) -> None:
    """Redis frozen for less than outage_after timeouts: the call waits and Redis answers
    it (refused here); the gate never opens, though on_outage is open."""
    server.start()
    registry = CollectorRegistry()
    limiter = limiter_on(server, registry, on_outage="open", redis_timeout=0.2, outage_after=3)
    await limiter.start()
    plan = rpm(1)
    try:
        assert (await limiter.admit(plan, 0)).allowed
        server.pause(True)
        waiting = asyncio.ensure_future(limiter.admit(plan, 0))
        await asyncio.sleep(0.3)  # one timeout, maybe the start of a second
        server.pause(False)
        verdict = await waiting
        assert not verdict.allowed
        assert verdict.refused_by == plan.buckets[0]
        assert (registry.get_sample_value("gateway_limits_errors_total") or 0) >= 1
        assert degraded(registry, "open") == 0
    finally:
        await limiter.aclose()


async def test_timeouts_in_a_row_make_an_outage_and_a_probe_ends_it(server: RedisProcess) -> None:
    server.start()
    registry = CollectorRegistry()
    limiter = limiter_on(server, registry, on_outage="closed", redis_timeout=0.2, outage_after=2)
    await limiter.start()
    try:
        server.pause(True)
        started = time.monotonic()
        verdict = await limiter.admit(rpm(1000), 0)
        assert not verdict.allowed
        assert verdict.refused_by is None
        assert time.monotonic() - started >= 0.4  # two timeouts of 0.2 s first
        assert degraded(registry, "closed") == 1
        answer = limiter.check(rpm(1000), 0)  # now no call waits on Redis
        assert answer is not None
        assert not answer.allowed
        server.pause(False)
        await eventually(lambda: degraded(registry, "closed") == 0)
        assert (await limiter.admit(rpm(1000), 0)).allowed
    finally:
        await limiter.aclose()


async def _allowed(limiter: RedisLimiter, plan: Plan) -> bool:
    return (await limiter.admit(plan, 0)).allowed
