"""Redis going away and coming back: routing keeps working throughout and recovers."""

from __future__ import annotations

import time

from gateway.index import open_index
from gateway.index.base import PrefixIndex
from gateway.settings import Settings, load_settings
from tests.conftest import free_port
from tests.integration.index.redis_servers import RedisProcess
from tests.polling import eventually

A = list(range(1, 9))
B = list(range(11, 19))


def settings(port: int) -> Settings:
    return load_settings(
        redis={"url": f"redis://127.0.0.1:{port}/0", "timeout": 0.1, "probe_interval": 0.1},
    )


async def test_unreachable_redis_degrades_to_the_local_index() -> None:
    index = open_index(settings(free_port()))
    await index.start()
    try:
        began = time.monotonic()
        index.record("m", "b0", A)
        assert await index.lookup("m", A) == {"b0": 8}
        assert not index.healthy
        assert await index.lookup("m", B) == {}
        index.forget("m", "b0", A, keep_blocks=2)
        assert await index.lookup("m", A) == {"b0": 2}
        assert await index.size() == 2
        assert time.monotonic() - began < 2.0
    finally:
        await index.aclose()


async def test_index_survives_a_redis_restart(server: RedisProcess) -> None:
    index: PrefixIndex = open_index(settings(server.port))
    await index.start()
    try:
        index.record("m", "b0", A)
        await index.flush()
        assert await index.lookup("m", A) == {"b0": 8}
        assert index.healthy

        server.kill()
        # The local understudy answers with what this replica recorded; nothing raises.
        assert await index.lookup("m", A) == {"b0": 8}
        assert not index.healthy
        index.record("m", "b1", B)
        assert await index.lookup("m", B) == {"b1": 8}

        server.start()
        await eventually(lambda: index.healthy)
        # The restarted Redis is empty (no persistence): it learns again from new records.
        index.record("m", "b2", B)
        await index.flush()
        assert await index.lookup("m", B) == {"b2": 8}
        assert await index.size() == 8
    finally:
        await index.aclose()


async def test_a_failing_flush_opens_the_breaker(server: RedisProcess) -> None:
    index = open_index(settings(server.port))
    await index.start()
    try:
        assert await index.lookup("m", A) == {}
        server.kill()
        index.record("m", "b0", A)
        await index.flush()
        await eventually(lambda: not index.healthy)
        assert await index.lookup("m", A) == {"b0": 8}
    finally:
        await index.aclose()


async def test_only_repeated_timeouts_open_the_breaker(server: RedisProcess) -> None:
    index = open_index(settings(server.port))
    await index.start()
    try:
        index.record("m", "b0", A)
        await index.flush()
        server.pause(True)
        try:
            for _ in range(2):
                assert await index.lookup("m", A) == {"b0": 8}
                assert index.healthy
            assert await index.lookup("m", A) == {"b0": 8}
            assert not index.healthy
        finally:
            server.pause(False)
        await eventually(lambda: index.healthy)
        assert await index.lookup("m", B) == {}
    finally:
        await index.aclose()
