"""The in-process limiter on a fake clock: exact GCRA arithmetic and daily pruning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from gateway.limits import LimitMetrics, MemoryLimiter
from gateway.limits.base import Bucket, Budget, Counter, Plan


class Clocks:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = datetime(2026, 11, 29, 23, 59, tzinfo=UTC)

    def limiter(self) -> MemoryLimiter:
        return MemoryLimiter(LimitMetrics(CollectorRegistry()), lambda: self.mono,
                             lambda: self.wall)  # fmt: skip


async def test_a_bucket_refills_one_step_at_a_time() -> None:
    clocks = Clocks()
    lim = clocks.limiter()
    plan = Plan("t", (Bucket("key", "requests", "k", 6),), (), ())  # one per 10 s
    for _ in range(6):
        assert (await lim.admit(plan, 0)).allowed
    refused = await lim.admit(plan, 0)
    assert refused.retry_after == pytest.approx(10.0)
    assert refused.windows[0].reset == pytest.approx(60.0)
    clocks.mono += 9.9
    assert not (await lim.admit(plan, 0)).allowed
    clocks.mono += 0.1
    ok = await lim.admit(plan, 0)
    assert ok.allowed
    assert ok.windows[0].remaining == 0


async def test_yesterdays_spend_is_forgotten_at_midnight() -> None:
    clocks = Clocks()
    lim = clocks.limiter()
    today, month = Counter("key", "k", "d20261129"), Counter("key", "k", "m202611")
    plan = Plan("t", (), (Budget(today, 10, clocks.wall),), (today, month))
    lim.settle(plan, 0, 10)
    assert not (await lim.admit(plan, 0)).allowed
    clocks.wall += timedelta(minutes=2)  # 2026-11-30 00:01
    lim.settle(Plan("t", (), (), ()), 0, 0)
    assert (await lim.admit(plan, 0)).allowed  # the day's counter is gone
    assert not (await lim.admit(Plan("t", (), (Budget(month, 10, clocks.wall),), ()), 0)).allowed
