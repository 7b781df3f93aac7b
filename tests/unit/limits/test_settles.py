"""Settles waiting for a Redis round stay within their bounds however many keys owe."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.limits.lua import Charge
from gateway.limits.metrics import LimitMetrics
from gateway.limits.settles import Settles


def test_at_most_size_settles_wait_and_the_rest_are_counted_as_dropped() -> None:
    registry = CollectorRegistry()
    settles = Settles(size=10, metrics=LimitMetrics(registry))
    for i in range(50):
        key = f"bucket-{i}"
        settles.add((key,), [Charge(key, 1, 100)], 0, ())
    assert len(settles.take()) == 10
    assert registry.get_sample_value("gateway_limits_settles_dropped_total") == 40


def test_counter_lifetimes_are_remembered_for_a_bounded_set_of_periods() -> None:
    settles = Settles(size=10, metrics=LimitMetrics(CollectorRegistry()))
    for day in range(200):
        assert settles._ttl(f"d{20_000 + day}") >= 1
        assert len(settles._expiry) <= 65
