"""The Redis limiter's per-key state stays within its bounds however many keys call."""

from __future__ import annotations

from decimal import Decimal

from prometheus_client import CollectorRegistry

from gateway.flow import Principal
from gateway.limits.redis import SHAPES
from gateway.stages.limits import plan_for
from tests.integration.limits.conftest import redis_limiter


async def test_shapes_leases_and_views_are_bounded(
    redis_server_url: str, redis_prefix: str
) -> None:
    lim = redis_limiter(redis_server_url, redis_prefix, CollectorRegistry())
    await lim.start()
    try:
        for i in range(SHAPES + 50):
            p = Principal(key_id=f"key-{i}", team="eng", rpm=10, tpm=1000, budget_usd=Decimal("1"))
            lim._shape(plan_for(p, 20_000 + i % 100))
            assert len(lim._shapes) <= SHAPES
            assert len(lim._views) <= SHAPES
        # a key's leases (requests and tokens) and the team's are shared by its plans
        assert len(lim._leases) <= 2 * SHAPES + 2
        assert len(lim._views) > 0
    finally:
        await lim.aclose()
