"""The prefix index: which backend holds which prompt prefix (prefill-state handles)."""

from __future__ import annotations

from gateway.index.base import PrefixIndex
from gateway.index.memory import MemoryIndex
from gateway.settings import Settings


def open_index(settings: Settings) -> PrefixIndex:
    """The in-process index, or, with a Redis URL, the shared one with a local understudy.

    The caller owns the result: ``await index.start()`` and ``await index.aclose()``.
    """
    local = MemoryIndex(settings.routing, settings.prefix)
    if settings.redis.url is None:
        return local
    from redis.asyncio import Redis, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from gateway.index.redis import RedisIndex
    from gateway.index.resilient import ResilientIndex

    # No client-side retries: the breaker decides when to try again, and a lookup must
    # fail within redis.timeout rather than after a retry schedule.
    client = (RedisCluster if settings.redis.cluster else Redis).from_url(
        settings.redis.url,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
        retry=Retry(NoBackoff(), 0),
    )
    shared = RedisIndex(client, settings.redis, settings.routing, settings.prefix)
    return ResilientIndex(shared, local, settings.redis)
