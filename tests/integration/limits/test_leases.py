"""Leases against real Redis: two limiters (two replicas) share every bucket and budget.

A bucket of 600 a minute refills one unit every 0.1 s and leases up to 10 units at a time;
the bounds below allow for what refills while a test runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from gateway.limits.base import Bucket, Budget, Counter, Plan
from gateway.limits.lease import target
from gateway.limits.redis import RedisLimiter
from tests.integration.limits.conftest import redis_limiter

RPM = 600
PERIOD = 0.2
"""redis.lease_period here: how long unused units stay away, and a spend view's age."""


def refill(since: float) -> int:
    """Units the bucket may have regained since ``since`` (one more for rounding)."""
    return math.ceil((time.monotonic() - since) * RPM / 60) + 1


def rpm_plan() -> Plan:
    tag = "t-" + uuid.uuid4().hex[:8]
    return Plan(tag, (Bucket("team", "requests", tag, RPM),), (), ())


@pytest.fixture
async def pair(redis_server_url: str, redis_prefix: str) -> AsyncIterator[list[RedisLimiter]]:
    async with replicas(redis_server_url, redis_prefix, PERIOD) as limiters:
        yield limiters


@contextlib.asynccontextmanager
async def replicas(url: str, prefix: str, period: float) -> AsyncIterator[list[RedisLimiter]]:
    limiters = [
        redis_limiter(url, prefix, CollectorRegistry(), lease_period=period) for _ in range(2)
    ]
    for lim in limiters:
        await lim.start()
    try:
        yield limiters
    finally:
        for lim in limiters:
            await lim.aclose()


async def drain(lim: RedisLimiter, plan: Plan) -> int:
    """Admit one call after another until one is refused; returns how many were served."""
    for served in range(3 * RPM):
        if not (await lim.admit(plan, 0)).allowed:
            return served
    raise AssertionError("never refused")


async def test_a_limit_holds_across_two_replicas_with_leases(pair: list[RedisLimiter]) -> None:
    plan, started, served = rpm_plan(), time.monotonic(), 0
    for _ in range(3 * RPM):
        verdicts = await asyncio.gather(*(lim.admit(plan, 0) for lim in pair for _ in range(8)))
        served += sum(v.allowed for v in verdicts)
        if not any(v.allowed for v in verdicts):
            break
    # Both refused everything: neither holds a unit it could still use, so every unit the
    # bucket had went to a served call, and no call was served beyond it.
    assert RPM <= served <= RPM + refill(started)


async def test_a_grant_is_never_exceeded(redis_server_url: str, redis_prefix: str) -> None:
    # Leases of 30 s: the holder's must outlive the other's drain of the bucket, however
    # long a busy machine makes it.
    async with replicas(redis_server_url, redis_prefix, 30.0) as (holder, other):
        plan, started = rpm_plan(), time.monotonic()
        assert (await holder.admit(plan, 0)).allowed  # the grant: this call and a lease
        drained = await drain(other, plan)
        assert drained >= RPM - 1 - target(RPM)
        held = await drain(holder, plan)  # the shared bucket is empty: only the lease serves
        assert 1 <= held <= target(RPM) + refill(started)
        assert 1 + drained + held <= RPM + refill(started)


async def test_unused_units_go_back_at_shutdown(pair: list[RedisLimiter]) -> None:
    holder, other = pair
    plan, started = rpm_plan(), time.monotonic()
    for _ in range(2):
        assert (await holder.admit(plan, 0)).allowed
    await holder.aclose()
    assert RPM - 2 <= await drain(other, plan) <= RPM - 2 + refill(started)


async def test_unused_units_go_back_when_they_age_out(pair: list[RedisLimiter]) -> None:
    holder, other = pair
    plan, started = rpm_plan(), time.monotonic()
    for _ in range(2):
        assert (await holder.admit(plan, 0)).allowed
    await asyncio.sleep(3 * PERIOD)  # past the lease's life and the sweep after it
    assert RPM - 2 <= await drain(other, plan) <= RPM - 2 + refill(started)


async def test_a_budget_is_exact_in_one_replica_and_reaches_the_other_within_a_period(
    pair: list[RedisLimiter],
) -> None:
    spender, other = pair
    counter = Counter("key", "k-" + uuid.uuid4().hex[:8], "d20261129")
    budget = Budget(counter, 1_000, datetime.now(UTC) + timedelta(days=1))
    plan = Plan("t-" + uuid.uuid4().hex[:8], (), (budget,), (counter,))
    assert (await other.admit(plan, 0)).allowed  # its view: nothing spent
    assert (await spender.admit(plan, 0)).allowed
    spender.settle(plan, 0, 1_000)  # the call that crosses the budget...
    refused = await spender.admit(plan, 0)  # ...and the next one, before any flush
    assert not refused.allowed
    assert refused.refused_by == budget
    await spender.flush()
    await asyncio.sleep(PERIOD)
    refused = await other.admit(plan, 0)
    assert not refused.allowed
    assert refused.refused_by == budget


async def test_the_settle_that_spends_a_budget_goes_at_once(
    redis_server_url: str, redis_prefix: str
) -> None:
    """Spend short of a budget waits for settle_interval (here a minute); the call that
    spends it does not, so every replica reading the counter from then on refuses."""
    from redis.asyncio import Redis

    spender, other = limiters = [
        redis_limiter(redis_server_url, redis_prefix, CollectorRegistry(), settle_interval=60)
        for _ in range(2)
    ]
    client = Redis.from_url(redis_server_url)
    for lim in limiters:
        await lim.start()
    try:
        tag = "t-" + uuid.uuid4().hex[:8]
        counter = Counter("key", "k-" + uuid.uuid4().hex[:8], "d20261129")
        key = f"{redis_prefix}spend:{{{tag}}}:key:{counter.owner}:{counter.period_id}"
        budget = Budget(counter, 1_000, datetime.now(UTC) + timedelta(days=1))
        plan = Plan(tag, (), (budget,), (counter,))
        assert (await spender.admit(plan, 0)).allowed
        spender.settle(plan, 0, 100)
        await spender.flush()  # the round that starts the minute
        spender.settle(plan, 0, 300)  # short of it: waits here
        await asyncio.sleep(0.3)
        assert int(await client.get(key) or 0) == 100
        spender.settle(plan, 0, 600)  # spends it: sent now, with the 300
        for _ in range(100):
            await asyncio.sleep(0.02)
            if int(await client.get(key) or 0) == 1_000:
                break
        else:
            raise AssertionError("the settle that spent the budget did not go at once")
        refused = await other.admit(plan, 0)  # no view yet: reads the counter
        assert not refused.allowed
        assert refused.refused_by == budget
    finally:
        for lim in limiters:
            await lim.aclose()
        await client.aclose()


async def test_calls_from_the_leases_refresh_the_spend_views_at_half_their_life(
    redis_server_url: str, redis_prefix: str
) -> None:
    """Calls keep coming from the leases past half a period, and one of them has the spend
    read again: the other replica's spend is in this one's view before the view ages out."""
    period = 1.0
    spender, other = limiters = [
        redis_limiter(redis_server_url, redis_prefix, CollectorRegistry(), lease_period=period)
        for _ in range(2)
    ]
    for lim in limiters:
        await lim.start()
    try:
        counter = Counter("key", "k-" + uuid.uuid4().hex[:8], "d20261129")
        budget = Budget(counter, 1_000, datetime.now(UTC) + timedelta(days=1))
        tag = "t-" + uuid.uuid4().hex[:8]
        plan = Plan(tag, (Bucket("key", "requests", "k", 60_000),), (budget,), (counter,))
        assert (await spender.admit(plan, 0)).allowed  # reads the spend (0) and takes a lease
        started = time.monotonic()
        assert (await other.admit(plan, 0)).allowed
        other.settle(plan, 0, 500)
        await other.flush()  # the counter holds 500; the spender's view does not know yet
        # Past half life one call asks for the refresh; it goes within a quarter period
        # (with the next settles, or alone by then) and lands before the view ages out.
        while time.monotonic() - started < 0.9 * period:
            assert (await spender.admit(plan, 0)).allowed
            await asyncio.sleep(0.02)
        spender.settle(plan, 0, 500)  # 500 + the other's 500: the budget is spent
        refused = await spender.admit(plan, 0)
        assert not refused.allowed
        assert refused.refused_by == budget
    finally:
        for lim in limiters:
            await lim.aclose()


async def test_top_ups_ride_with_the_settles_so_a_busy_replica_makes_one_round_per_interval(
    redis_server_url: str, redis_prefix: str
) -> None:
    """Under steady calls the sender sends one pipeline per settle interval, and the leases'
    and views' top-ups (due every half period, here four times a second) go in it rather
    than in rounds of their own: every round costs the gateway CPU."""
    interval, period, seconds = 0.05, 0.4, 1.2
    lim = redis_limiter(
        redis_server_url, redis_prefix, CollectorRegistry(),
        lease_period=period, settle_interval=interval,
    )  # fmt: skip
    rounds = 0
    run = lim._sender._run

    async def counted(commands: list[tuple[str, list[str], list[object]]]) -> list[object]:
        nonlocal rounds
        rounds += 1
        return await run(commands)

    lim._sender._run = counted  # type: ignore[method-assign]
    await lim.start()
    try:
        counter = Counter("key", "k-" + uuid.uuid4().hex[:8], "d20261129")
        budget = Budget(counter, 10**12, datetime.now(UTC) + timedelta(days=1))
        tag = "t-" + uuid.uuid4().hex[:8]
        plan = Plan(tag, (Bucket("key", "requests", "k", 600_000),), (budget,), (counter,))
        assert (await lim.admit(plan, 0)).allowed
        await lim.flush()
        rounds, started, served = 0, time.monotonic(), 0
        while time.monotonic() - started < seconds:
            assert (await lim.admit(plan, 0)).allowed
            lim.settle(plan, 0, 100)
            served += 1
            await asyncio.sleep(0.002)
        elapsed = time.monotonic() - started
        assert served > 100
        assert 0 < rounds <= elapsed / interval + 2
    finally:
        await lim.aclose()
