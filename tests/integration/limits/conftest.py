from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.limits import Limiter, LimitMetrics, MemoryLimiter
from gateway.limits.redis import RedisLimiter
from gateway.settings import LimitsSettings, RedisSettings


def redis_limiter(
    url: str,
    prefix: str,
    registry: CollectorRegistry,
    limits: LimitsSettings | None = None,
    **kw: Any,
) -> RedisLimiter:
    """A Redis limiter whose client, as the gateway's (redis_client.py), never retries:
    the limiter decides what a timeout or a failure means. (A plain pool: the gateway's
    blocking one makes the lease tests' drains slower than their 0.2 s leases.)"""
    settings = RedisSettings(url=url, key_prefix=prefix, **kw)
    limits = limits or LimitsSettings()
    t = limits.redis_timeout
    client = Redis.from_url(url, socket_timeout=t, socket_connect_timeout=t,
                            retry=Retry(NoBackoff(), 0))  # fmt: skip
    return RedisLimiter(client, settings, limits, LimitMetrics(registry))


@pytest.fixture(params=["memory", "redis"])
async def limiter(
    request: pytest.FixtureRequest, redis_server_url: str, redis_prefix: str
) -> AsyncIterator[Limiter]:
    """The same contract, held by the in-process limiter and by the Redis one."""
    registry = CollectorRegistry()
    if request.param == "memory":
        lim: Limiter = MemoryLimiter(LimitMetrics(registry))
    else:
        lim = redis_limiter(redis_server_url, redis_prefix, registry)
    await lim.start()
    yield lim
    await lim.aclose()
