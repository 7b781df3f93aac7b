"""Rate limits and budgets: the Protocol, the in-process limiter and the Redis one."""

from __future__ import annotations

from gateway.limits.base import Limiter
from gateway.limits.memory import MemoryLimiter
from gateway.limits.metrics import LimitMetrics
from gateway.settings import Settings

__all__ = ["LimitMetrics", "Limiter", "MemoryLimiter", "open_limiter"]


def open_limiter(settings: Settings, metrics: LimitMetrics) -> Limiter:
    """In-process unless a Redis URL is configured. The caller owns start() and aclose()."""
    if settings.redis.url is None:
        return MemoryLimiter(metrics)
    from redis.asyncio import Redis, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from gateway.limits.redis import RedisLimiter

    # No client retries: a failing Redis must cost one timeout, then the limiter fails open.
    client = (RedisCluster if settings.redis.cluster else Redis).from_url(
        settings.redis.url,
        socket_timeout=settings.redis.timeout,
        socket_connect_timeout=settings.redis.timeout,
        retry=Retry(NoBackoff(), 0),
    )
    return RedisLimiter(client, settings.redis, metrics)
