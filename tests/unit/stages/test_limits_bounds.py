"""The limits stage's memos stay within their bounds however many principals call."""

from __future__ import annotations

from gateway.flow import Principal
from gateway.limits.base import Bucket, Verdict, Window
from gateway.stages import limits


def test_plans_are_kept_for_at_most_plans_principals() -> None:
    day, plans = 20_000, limits.Plans()
    for i in range(limits.PLANS + 100):
        plans.get(Principal(key_id=f"key-{i}", team="eng", rpm=10), day)
        assert len(plans) <= limits.PLANS


def test_header_memo_is_bounded() -> None:
    bound = limits.raw_ratelimit_headers.cache_info().maxsize
    assert bound is not None
    for i in range(bound + 50):
        bucket = Bucket("key", "requests", f"key-{i}", 100)
        limits.raw_ratelimit_headers(Verdict(True, (Window(bucket, 99 - i % 99, 0.5),)))
    assert limits.raw_ratelimit_headers.cache_info().currsize <= bound
