"""Lease bookkeeping: how much a replica asks for, when it tops up, what headers it shows."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.limits.base import Bucket, Budget, Counter, Plan, Verdict
from gateway.limits.lease import (
    LAG,
    BucketLease,
    BudgetView,
    Lease,
    Shape,
    SpendView,
    target,
)


def test_a_lease_targets_a_second_of_refill_and_none_below_60_a_minute() -> None:
    assert target(6000) == 100
    assert target(600) == 10
    assert target(59) == 0  # every call asks Redis: exact, as without leases


def test_a_lease_asks_only_for_what_tops_it_up() -> None:
    lease = Lease(600)
    assert lease.extra() == 10
    lease.granted(7, remaining=500, reset=10.0, now=0.0, period=1.0)
    assert lease.extra() == 3
    lease.granted(20, remaining=480, reset=12.0, now=0.0, period=1.0)  # a refund, say
    assert lease.extra() == 0


def test_a_grant_lives_one_period_and_a_grant_of_nothing_leaves_it_dead() -> None:
    lease = Lease(600)
    lease.granted(0, remaining=3, reset=59.7, now=5.0, period=1.0)  # little left: none extra
    assert not lease.live(5.0)
    lease.granted(10, remaining=400, reset=20.0, now=5.0, period=1.0)
    assert lease.live(5.9)
    assert not lease.live(6.0)


def test_a_lease_is_topped_up_when_half_spent_or_half_aged_but_not_twice() -> None:
    lease = Lease(600)
    lease.granted(10, remaining=400, reset=20.0, now=0.0, period=1.0)
    assert not lease.low(0.1, 1.0)
    assert lease.low(0.6, 1.0)  # half its life gone
    lease.held = 4
    assert lease.low(0.1, 1.0)  # under half its target
    lease.asking = True
    assert not lease.low(0.1, 1.0)
    assert not Lease(59).low(0.0, 1.0)


def test_headers_count_the_units_held_here_as_the_buckets() -> None:
    lease = Lease(600)  # a unit refills every 0.1 s
    lease.granted(10, remaining=500, reset=10.0, now=0.0, period=1.0)
    assert lease.window() == (510, 9.0)
    lease.held = 4
    assert lease.window() == (504, 9.6)
    lease.remaining, lease.reset = 599, 0.1
    lease.held = 8
    assert lease.window() == (600, 0.0)  # never more than the limit, never a negative reset


def test_a_spend_view_adds_this_replicas_spend_since_the_read() -> None:
    view = SpendView(base=1_000, mark=300, read_at=0.0, own=300)
    assert view.value() == 1_000
    view.own += 150
    assert view.value() == 1_150


def test_a_live_lease_keeps_refunds_up_to_its_target_and_pays_overruns_from_what_it_holds() -> None:
    lease = Lease(600)
    lease.granted(10, remaining=500, reset=10.0, now=0.0, period=1.0)
    lease.held = 4  # six spent
    assert lease.reconcile(-5, 0.5) == 0  # a refund: held here
    assert lease.reconcile(-5, 0.5) == -4  # beyond the target: back to the bucket
    assert lease.held == 10
    assert lease.reconcile(20, 0.5) == 10  # an overrun beyond what it holds: Redis is told
    assert lease.held == 0
    assert lease.reconcile(-5, 1.0) == -5  # aged out: the refund goes to the bucket


def shape_of(rpm: int, tpm: int, view: SpendView | None = None) -> Shape:
    """A plan with a request and a token bucket (leases granted at 0.0, period 1.0) and,
    with ``view``, a budget of 1,000 units."""
    buckets = (Bucket("key", "requests", "k", rpm), Bucket("key", "tokens", "k", tpm))
    leases = tuple(Lease(b.limit) for b in buckets)
    for lease in leases:
        lease.granted(lease.target, remaining=lease.limit, reset=0.0, now=0.0, period=1.0)
    counter = Counter("key", "k", "d20261129")
    budgets = (Budget(counter, 1_000, datetime(2026, 11, 30, tzinfo=UTC)),) if view else ()
    return Shape(
        plan=Plan("t", buckets, budgets, (counter,)),
        buckets=tuple(
            BucketLease(b.kind, b, lease, tokens=b.kind == "tokens")
            for b, lease in zip(buckets, leases, strict=True)
        ),
        budgets=tuple(BudgetView("spend", b, view) for b in budgets if view is not None),
        token_leases=(leases[1],),
        spend_keys=("spend",),
        period_ids=("d20261129",),
        grant_keys=[],
    )


def test_a_verdict_serves_the_next_calls_until_they_took_an_eighth_of_a_lease() -> None:
    shape = shape_of(rpm=6000, tpm=60_000)  # targets 100 requests, 1,000 tokens
    verdict = shape.remember(Verdict(True), now=0.0)
    for _ in range(100 // LAG):  # twelve calls of ten tokens
        assert shape.reuse(10, now=0.01, fresh=0.1) is verdict
    assert shape.reuse(10, now=0.01, fresh=0.1) is None  # a thirteenth request: too far
    shape.remember(verdict, now=0.0)
    assert shape.reuse(1_000 // LAG, now=0.01, fresh=0.1) is verdict
    assert shape.reuse(1, now=0.01, fresh=0.1) is None  # past an eighth of the tokens


def test_a_verdict_serves_for_fresh_seconds_and_never_near_a_limit() -> None:
    shape = shape_of(rpm=6000, tpm=60_000)
    verdict = shape.remember(Verdict(True), now=0.0)
    assert shape.reuse(1, now=0.09, fresh=0.1) is verdict
    assert shape.reuse(1, now=0.1, fresh=0.1) is None
    small = shape_of(rpm=420, tpm=60_000)  # a target of 7 requests: exact headers
    small.remember(verdict, now=0.0)
    assert small.reuse(0, now=0.0, fresh=0.1) is None
