"""Rate limits and budgets: the Protocol, the in-process limiter and the Redis one."""

from __future__ import annotations

import logging

from gateway.limits.base import Limiter
from gateway.limits.memory import MemoryLimiter
from gateway.limits.metrics import LimitMetrics
from gateway.settings import Settings

__all__ = ["LimitMetrics", "Limiter", "MemoryLimiter", "open_limiter"]

log = logging.getLogger(__name__)

POOL = 64
"""Redis connections one gateway process uses for limits at most (calls beyond wait)."""


def open_limiter(settings: Settings, metrics: LimitMetrics) -> Limiter:
    """In-process unless a Redis URL is configured. The caller owns start() and aclose()."""
    if settings.redis.url is None:
        if settings.server.workers > 1:
            log.warning("limits: %d workers without Redis each count on their own: rate "
                        "limits and budgets are that many times looser; set redis.url",
                        settings.server.workers)  # fmt: skip
        return MemoryLimiter(metrics)
    from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from gateway.limits.redis import RedisLimiter

    # No client retries: a failing Redis must cost one timeout, then the limiter fails open.
    # A bounded pool that waits (redis-py's default raises past 100 connections in use).
    r = settings.redis
    options = {"socket_timeout": r.timeout, "socket_connect_timeout": r.timeout,
               "retry": Retry(NoBackoff(), 0)}  # fmt: skip
    client: Redis | RedisCluster
    if r.cluster:
        client = RedisCluster.from_url(r.url, **options)
    else:
        pool = BlockingConnectionPool.from_url(r.url, max_connections=POOL, timeout=r.timeout,
                                               **options)  # fmt: skip
        client = Redis(connection_pool=pool)
    return RedisLimiter(client, r, metrics)
