from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import BackendUnavailable, QuotaExceeded, RateLimited
from gateway.flow import Call, Principal, Request
from gateway.keys.store import Spend
from gateway.limits import LimitMetrics, MemoryLimiter
from gateway.limits.base import Bucket, Budget, Counter, Verdict, Window
from gateway.stages import limits

AT = datetime(2026, 11, 29, 15, 30, tzinfo=UTC)
DAY = int(AT.timestamp() // 86400)


def principal(**kw: Any) -> Principal:
    return Principal(key_id="key_1", team="eng", **kw)


def test_a_plan_has_a_bucket_per_limit_and_a_budget_per_budget() -> None:
    p = principal(rpm=10, tpm=1000, team_rpm=100, budget_usd=Decimal("1.5"),
                  budget_period="day", team_budget_usd=Decimal(20))  # fmt: skip
    plan = limits.plan_for(p, DAY)
    assert plan.tag == "eng"
    assert plan.buckets == (
        Bucket("key", "requests", "key_1", 10),
        Bucket("key", "tokens", "key_1", 1000),
        Bucket("team", "requests", "eng", 100),
    )
    assert [b.cost(123) for b in plan.buckets] == [1, 123, 1]
    assert [(b.counter, b.limit) for b in plan.budgets] == [
        (Counter("key", "key_1", "d20261129"), 15_000_000_000),
        (Counter("team", "eng", "m202611"), 200_000_000_000),
    ]
    assert plan.budgets[0].ends == datetime(2026, 11, 30, tzinfo=UTC)
    assert plan.budgets[1].ends == datetime(2026, 12, 1, tzinfo=UTC)
    assert set(plan.counters) == {
        Counter("key", "key_1", "d20261129"),
        Counter("key", "key_1", "m202611"),
        Counter("team", "eng", "d20261129"),
        Counter("team", "eng", "m202611"),
    }


def test_a_principal_without_limits_has_an_empty_plan_but_still_counts_spend() -> None:
    plan = limits.plan_for(principal(), DAY)
    assert plan.buckets == ()
    assert plan.budgets == ()
    assert len(plan.counters) == 4


def test_headers_report_the_tightest_bucket_of_each_kind() -> None:
    key = Bucket("key", "requests", "key_1", 10)
    team = Bucket("team", "requests", "eng", 100)
    tokens = Bucket("key", "tokens", "key_1", 1000)
    verdict = Verdict(True, (Window(key, 3, 42.0), Window(team, 80, 12.0),
                             Window(tokens, 950, 3.0)))  # fmt: skip
    assert limits.ratelimit_headers(verdict) == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-reset-requests": "42s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "950",
        "x-ratelimit-reset-tokens": "3s",
    }
    raw = limits.raw_ratelimit_headers(verdict)
    assert raw[:2] == ((b"x-ratelimit-limit-requests", b"10"),
                       (b"x-ratelimit-remaining-requests", b"3"))  # fmt: skip
    assert len(raw) == 6


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0174, "18ms"), (1.0, "1s"), (2.5014, "2.501s"), (360.0, "6m0s"), (61.5, "1m1.5s")],
)
def test_durations_read_like_openais(seconds: float, text: str) -> None:
    assert limits.duration(seconds) == text


def _limiter() -> MemoryLimiter:
    return MemoryLimiter(LimitMetrics(CollectorRegistry()))


def test_a_rate_refusal_is_429_with_retry_after() -> None:
    bucket = Bucket("team", "requests", "eng", 3)
    verdict = Verdict(False, (Window(bucket, 0, 59.9),), bucket, 19.2)
    err = limits.refusal(verdict, 1, _limiter())
    assert isinstance(err, RateLimited)
    assert err.status == 429
    assert err.code == "rate_limit_exceeded"
    assert err.headers["retry-after"] == "20"
    assert err.headers["retry-after-ms"] == "19200"
    assert err.headers["x-ratelimit-remaining-requests"] == "0"
    assert "team" in err.message


def test_limits_that_cannot_be_checked_refuse_with_503_and_retry_after() -> None:
    """What the Redis limiter answers in an outage with limits.on_outage: closed."""
    err = limits.refusal(Verdict(False, retry_after=0.2), 1, _limiter())
    assert isinstance(err, BackendUnavailable)
    assert err.status == 503
    assert err.code == "limits_unavailable"
    assert err.headers["retry-after"] == "1"


def test_a_request_larger_than_the_limit_is_told_not_to_retry() -> None:
    bucket = Bucket("key", "tokens", "key_1", 100)
    err = limits.refusal(Verdict(False, (), bucket, None), 150, _limiter())
    assert isinstance(err, RateLimited)
    assert err.headers["x-should-retry"] == "false"
    assert "150 tokens" in err.message


def test_a_spent_budget_is_insufficient_quota() -> None:
    budget = Budget(Counter("key", "key_1", "d20261129"), 10, datetime(2026, 11, 30, tzinfo=UTC))
    err = limits.refusal(Verdict(False, (), budget, None), 1, _limiter())
    assert isinstance(err, QuotaExceeded)
    assert (err.status, err.type, err.code) == (429, "insufficient_quota", "insufficient_quota")
    assert err.headers["x-should-retry"] == "false"


def test_seeds_add_up_keys_into_their_teams() -> None:
    spends = [
        Spend("key_1", "eng", month=Decimal("1.5"), today=Decimal("0.25")),
        Spend("key_2", "eng", month=Decimal("0.0000000001"), today=Decimal(0)),
        Spend("key_3", None, month=Decimal(9), today=Decimal(9)),
    ]
    got = {(s.counter, s.tag): s.units for s in limits.seeds(spends, AT)}
    assert got == {
        (Counter("key", "key_1", "d20261129"), "eng"): 2_500_000_000,
        (Counter("key", "key_1", "m202611"), "eng"): 15_000_000_000,
        (Counter("team", "eng", "d20261129"), "eng"): 2_500_000_000,
        (Counter("team", "eng", "m202611"), "eng"): 15_000_000_001,
        (Counter("key", "key_2", "d20261129"), "eng"): 0,
        (Counter("key", "key_2", "m202611"), "eng"): 1,
    }


async def admit(
    call: Call, body_bytes: int, limiter: MemoryLimiter, headers: bool, plans: limits.Plans
) -> None:
    """As the pipeline calls it: await only what the stage hands back."""
    waiting = limits.admit(call, body_bytes, limiter, plans, headers)
    if waiting is not None:
        await waiting


def _call(p: Principal) -> Call:
    call = Call(id="r1", path="/v1/chat/completions", headers={})
    call.principal = p
    call.request = Request(endpoint="chat", model="m", body={}, max_tokens=5)
    return call


async def test_a_principals_calls_share_one_plan_and_quota_per_day() -> None:
    limiter, plans, p = _limiter(), limits.Plans(), principal(rpm=10)
    first, second = _call(p), _call(p)
    await admit(first, 40, limiter, headers=False, plans=plans)
    await admit(second, 400, limiter, headers=False, plans=plans)
    assert first.quota is not None
    assert second.quota is first.quota  # nothing built per call...
    assert (first.reserved_tokens, second.reserved_tokens) == (15, 105)  # ...but this
    tomorrow = _call(p)
    tomorrow.received_wall = first.received_wall + 86400
    await admit(tomorrow, 40, limiter, headers=False, plans=plans)
    assert tomorrow.quota is not None
    assert tomorrow.quota.plan is not first.quota.plan  # a new day, a new plan
    assert tomorrow.quota.plan == limits.plan_for(p, int(tomorrow.received_wall // 86400))


@pytest.mark.parametrize("headers", [True, False])
async def test_a_served_call_carries_the_headers_unless_they_are_off(headers: bool) -> None:
    limiter, plans, p = _limiter(), limits.Plans(), principal(rpm=2)
    served = _call(p)
    await admit(served, 40, limiter, headers, plans)
    assert served.quota is not None
    names = {name for name, _ in served.quota.headers}
    assert names == ({b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests",
                      b"x-ratelimit-reset-requests"} if headers else set())  # fmt: skip
    await admit(_call(p), 40, limiter, headers, plans)
    with pytest.raises(RateLimited) as refused:  # a refusal has them either way
        await admit(_call(p), 40, limiter, headers, plans)
    assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"
