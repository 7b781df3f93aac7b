"""Rate limits and budgets: the Protocol, the in-process limiter and the Redis one."""

from __future__ import annotations

import logging

from gateway.limits.base import Limiter
from gateway.limits.memory import MemoryLimiter
from gateway.limits.metrics import LimitMetrics
from gateway.settings import Settings

__all__ = ["LimitMetrics", "Limiter", "MemoryLimiter", "open_limiter"]

log = logging.getLogger(__name__)


def open_limiter(settings: Settings, metrics: LimitMetrics) -> Limiter:
    """In-process unless a Redis URL is configured. The caller owns start() and aclose()."""
    if settings.redis.url is None:
        if settings.server.workers > 1:
            log.warning("limits: %d workers without Redis each count on their own: rate "
                        "limits and budgets are that many times looser; set redis.url",
                        settings.server.workers)  # fmt: skip
        return MemoryLimiter(metrics)
    from gateway.limits.redis import RedisLimiter
    from gateway.redis_client import connect

    client = connect(settings.redis, settings.limits.redis_timeout)
    return RedisLimiter(client, settings.redis, settings.limits, metrics)
