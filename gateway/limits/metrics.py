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
            "Limiter calls to Redis that failed (the call was let through: limits fail open).",
            registry=registry,
        )
        self.dropped = Counter(
            "gateway_limits_settles_dropped",
            "Token reconciliations and spend increments lost to a Redis failure.",
            registry=registry,
        )
        self.degraded = Gauge(
            "gateway_limits_degraded",
            "1 while Redis fails and limits are not enforced.",
            registry=registry,
            multiprocess_mode="livemax",
        )
