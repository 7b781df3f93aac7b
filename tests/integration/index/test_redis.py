"""What only the Redis index has: its update queue and its key layout."""

from __future__ import annotations

import asyncio
import weakref

import redis.asyncio as aioredis

from gateway.index.redis import RedisIndex
from gateway.settings import PrefixSettings, RedisSettings, RoutingSettings
from tests.conftest import REDIS_URL


async def test_a_full_queue_sheds_its_oldest_updates(redis_prefix: str) -> None:
    settings = RedisSettings(key_prefix=redis_prefix, queue_size=2)
    index = RedisIndex(
        aioredis.Redis.from_url(REDIS_URL), settings, RoutingSettings(), PrefixSettings()
    )
    index.record("m", "b0", [1, 2])
    index.record("m", "b1", [1, 2])
    index.record("m", "b2", [1, 2])
    assert index.dropped == 1
    await index.start()
    try:
        await index.flush()
        assert await index.lookup("m", [1, 2]) == {"b1": 2, "b2": 2}
    finally:
        await index.aclose()


async def test_the_queue_holds_at_most_queue_size_times_max_blocks_machine_words(
    redis_prefix: str,
) -> None:
    settings = RedisSettings(key_prefix=redis_prefix, queue_size=3)
    index = RedisIndex(
        aioredis.Redis.from_url(REDIS_URL), settings, RoutingSettings(), PrefixSettings()
    )
    top = 2**64 - 1  # block hashes are unsigned 64-bit: the largest must survive the queue
    for i in range(10):
        index.record("m", f"b{i}", [top - j for j in range(2048)])
    queued = list(index._queue._queue)  # type: ignore[attr-defined]
    assert len(queued) == 3
    assert index.dropped == 7
    assert sum(len(hashes) * hashes.itemsize for *_, hashes in queued) == 3 * 2048 * 8
    await index.start()
    try:
        await index.flush()
        assert await index.lookup("m", [top - j for j in range(4)]) == {"b7": 4, "b8": 4, "b9": 4}
    finally:
        await index.aclose()


async def test_a_sent_batch_is_not_kept_while_the_flusher_waits(redis_prefix: str) -> None:
    settings = RedisSettings(key_prefix=redis_prefix)
    index = RedisIndex(
        aioredis.Redis.from_url(REDIS_URL), settings, RoutingSettings(), PrefixSettings()
    )
    index.record("m", "b0", [1, 2, 3])
    queued = weakref.ref(index._queue._queue[0][3])  # type: ignore[attr-defined]
    await index.start()
    try:
        await index.flush()
        for _ in range(20):  # the flusher's last steps after the queue's join() returns
            if queued() is None:
                break
            await asyncio.sleep(0)
        assert queued() is None
        assert await index.lookup("m", [1, 2, 3]) == {"b0": 3}
    finally:
        await index.aclose()


async def test_keys_share_the_models_hash_tag_and_expire(redis_prefix: str) -> None:
    routing = RoutingSettings(handle_ttl=30)
    index = RedisIndex(
        aioredis.Redis.from_url(REDIS_URL),
        RedisSettings(key_prefix=redis_prefix),
        routing,
        PrefixSettings(),
    )
    await index.start()
    index.record("chat-model", "10.0.0.5:8000", [1, 2, 3])
    await index.flush()
    await index.aclose()
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        keys = sorted(
            [k.decode() async for k in client.scan_iter(match=f"{redis_prefix}px:{{chat-model}}:*")]
        )
        assert keys == [
            f"{redis_prefix}px:{{chat-model}}:backends",
            f"{redis_prefix}px:{{chat-model}}:held:10.0.0.5:8000",
        ]
        for key in keys:
            assert 0 < await client.pttl(key) <= 30_000
    finally:
        await client.aclose()
