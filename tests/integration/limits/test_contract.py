"""The in-process and the Redis limiter give the same answers (real clock, real Redis)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gateway.limits import Limiter
from gateway.limits.base import Bucket, Budget, Counter, Plan, Seed
from gateway.limits.lease import LAG, target

DAY = Counter("key", "k1", "d20261129")
ENDS = datetime.now(UTC) + timedelta(days=1)


def team() -> str:
    return "t-" + uuid.uuid4().hex[:8]


def plan(tag: str, *buckets: Bucket, budgets: tuple[Budget, ...] = ()) -> Plan:
    counters = tuple(b.counter for b in budgets)
    return Plan(tag, buckets, budgets, counters)


async def test_requests_pass_up_to_the_limit_then_wait_a_step(limiter: Limiter) -> None:
    t = team()
    rpm = Bucket("key", "requests", "k1", 3)
    remaining = []
    for _ in range(3):
        v = await limiter.admit(plan(t, rpm), 0)
        assert v.allowed
        remaining.append(v.windows[0].remaining)
    assert remaining == [2, 1, 0]
    v = await limiter.admit(plan(t, rpm), 0)
    assert not v.allowed
    assert v.refused_by == rpm
    assert v.retry_after is not None
    assert 19.0 < v.retry_after <= 20.0  # one request refills every 60/3 s
    assert v.windows[0].remaining == 0
    assert 59.0 < v.windows[0].reset <= 60.0


async def test_a_refused_call_charges_none_of_its_buckets(limiter: Limiter) -> None:
    t = team()
    key = Bucket("key", "requests", "k1", 10)
    shared = Bucket("team", "requests", t, 2)
    other = Bucket("key", "requests", "k2", 10)
    assert (await limiter.admit(plan(t, key, shared), 0)).allowed
    assert (await limiter.admit(plan(t, other, shared), 0)).allowed
    v = await limiter.admit(plan(t, key, shared), 0)
    assert not v.allowed
    assert v.refused_by == shared
    assert v.windows[0].remaining == 9  # the key's bucket was not charged for the refusal


async def test_tokens_are_reserved_then_refunded_or_charged(limiter: Limiter) -> None:
    t = team()
    tpm = Bucket("key", "tokens", "k1", 100)
    p = plan(t, tpm)
    assert (await limiter.admit(p, 60)).allowed
    assert not (await limiter.admit(p, 60)).allowed
    limiter.settle(p, -50, 0)  # the call used 10 of the 60 reserved
    await limiter.flush()
    v = await limiter.admit(p, 60)
    assert v.allowed
    assert 28 <= v.windows[0].remaining <= 30
    limiter.settle(p, 40, 0)  # this one used 100: 40 more than reserved
    await limiter.flush()
    assert not (await limiter.admit(plan(t, tpm), 1)).allowed


async def test_a_call_larger_than_the_limit_never_fits(limiter: Limiter) -> None:
    v = await limiter.admit(plan(team(), Bucket("key", "tokens", "k1", 100)), 150)
    assert not v.allowed
    assert v.retry_after is None


async def test_buckets_refill_continuously(limiter: Limiter) -> None:
    t = team()
    tpm = Bucket("key", "tokens", "k1", 6000)  # refills 100 tokens a second
    assert (await limiter.admit(plan(t, tpm), 6000)).allowed
    refused = await limiter.admit(plan(t, tpm), 1)
    assert not refused.allowed
    assert refused.retry_after is not None
    assert refused.retry_after <= 0.011
    await asyncio.sleep(0.05)
    assert (await limiter.admit(plan(t, tpm), 1)).allowed


async def test_a_budget_refuses_once_spend_reaches_it(limiter: Limiter) -> None:
    t = team()
    budget = Budget(DAY, 1000, ENDS)
    rpm = Bucket("key", "requests", "k1", 100)
    p = plan(t, rpm, budgets=(budget,))
    assert (await limiter.admit(p, 0)).allowed
    limiter.settle(p, 0, 999)
    await limiter.flush()
    assert (await limiter.admit(p, 0)).allowed
    limiter.settle(p, 0, 1)
    await limiter.flush()
    v = await limiter.admit(p, 0)
    assert not v.allowed
    assert v.refused_by == budget
    assert v.windows[0].remaining == 98  # two admitted calls; the refusal took nothing
    other_day = Budget(Counter("key", "k1", "d20261130"), 1000, ENDS)
    assert (await limiter.admit(plan(t, budgets=(other_day,)), 0)).allowed


async def test_seeds_set_only_counters_that_do_not_exist(limiter: Limiter) -> None:
    t, fresh = team(), Counter("team", "x", "m202611")
    limiter.settle(plan(t, budgets=(Budget(DAY, 10, ENDS),)), 0, 3)
    await limiter.flush()
    await limiter.seed([Seed(DAY, t, 500, ENDS), Seed(fresh, t, 10, ENDS)])
    assert (await limiter.admit(plan(t, budgets=(Budget(DAY, 4, ENDS),)), 0)).allowed
    assert not (await limiter.admit(plan(t, budgets=(Budget(DAY, 3, ENDS),)), 0)).allowed
    assert not (await limiter.admit(plan(t, budgets=(Budget(fresh, 10, ENDS),)), 0)).allowed
    assert (await limiter.admit(plan(t, budgets=(Budget(fresh, 11, ENDS),)), 0)).allowed


async def test_a_burst_up_to_a_leased_limit_passes_with_headers_counting_down(
    limiter: Limiter,
) -> None:
    """600 a minute: large enough that the Redis limiter serves most calls from leases.
    Its headers may lag by an eighth of a lease's calls (one verdict serves the next calls
    while they take that much); the in-process limiter's are exact."""
    t, started = team(), time.monotonic()
    rpm = Bucket("key", "requests", "k1", 600)
    p = plan(t, rpm)  # one object for all calls, as the limits stage hands out
    for served in range(1, 601):
        v = await limiter.admit(p, 0)
        assert v.allowed
        refilled = math.ceil((time.monotonic() - started) * 10) + 1  # 10 a second
        lag = target(600) // LAG
        assert 600 - served <= v.windows[0].remaining <= 600 - served + refilled + lag
    extra = 0
    while (await limiter.admit(p, 0)).allowed:
        extra += 1
    assert extra <= math.ceil((time.monotonic() - started) * 10) + 1


@pytest.mark.parametrize("n", [50])
async def test_concurrent_calls_never_overshoot(limiter: Limiter, n: int) -> None:
    t = team()
    rpm = Bucket("team", "requests", t, 20)
    verdicts = await asyncio.gather(*(limiter.admit(plan(t, rpm), 0) for _ in range(n)))
    assert sum(v.allowed for v in verdicts) == 20
