"""The limiter's Prometheus metrics, on the registry the app injects."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class LimitMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.refused = Counter(
            "gateway_limits_refused",
            "Calls refused by a rate limit or budget, by scope (key, team) and what refused "
            "them (requests, tokens, budget).",
            ["scope", "limit"],
            registry=registry,
        )
        self.errors = Counter(
            "gateway_limits_errors",
            "Limiter rounds to Redis that failed or timed out (a few timeouts in a row, or one "
            "failure, make an outage: gateway_limits_degraded).",
            registry=registry,
        )
        self.dropped = Counter(
            "gateway_limits_settles_dropped",
            "Token reconciliations and spend increments lost to a Redis failure.",
            registry=registry,
        )
        self.degraded = Gauge(
            "gateway_limits_degraded",
            "1 while Redis is unreachable and the limits are not shared; mode says what they "
            "do then (limits.on_outage: local shares, closed, open).",
            ["mode"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.replicas = Gauge(
            "gateway_limits_replicas",
            "Replicas sharing the limits, as last read from Redis (each enforces 1/n of "
            "every limit while Redis is unreachable, with limits.on_outage: local).",
            registry=registry,
            multiprocess_mode="livemax",
        )
