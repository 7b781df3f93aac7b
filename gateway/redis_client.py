"""The one way the gateway connects to Redis (the prefix index and the limits share it)."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.settings import RedisSettings

POOL_SIZE = 256
"""Connections per client; a call beyond them waits (redis-py's default pool raises past
100 connections in use)."""


def connect(settings: RedisSettings, timeout: float) -> Redis | RedisCluster:
    """A client with no retries of its own: its caller decides what a failure means.

    A failing Redis must cost one `timeout`, after which the index falls back to its
    in-process copy and the limits count a timeout (limits/redis.py: a few in a row, or
    a refused connection, and they act as limits.on_outage says).
    """
    assert settings.url is not None
    options = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    if settings.cluster:
        return RedisCluster.from_url(settings.url, **options)
    pool = BlockingConnectionPool.from_url(
        settings.url, max_connections=POOL_SIZE, timeout=timeout, **options
    )
    return Redis.from_pool(pool)  # owns the pool: aclose() also closes its connections
