from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from gateway.limits import Limiter, LimitMetrics, MemoryLimiter
from gateway.limits.redis import RedisLimiter
from gateway.settings import RedisSettings


def redis_limiter(url: str, prefix: str, registry: CollectorRegistry, **kw: object) -> RedisLimiter:
    from redis.asyncio import Redis

    settings = RedisSettings(url=url, key_prefix=prefix, timeout=1.0, **kw)  # type: ignore[arg-type]
    client = Redis.from_url(url, socket_timeout=settings.timeout,
                            socket_connect_timeout=settings.timeout)  # fmt: skip
    return RedisLimiter(client, settings, LimitMetrics(registry))


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
