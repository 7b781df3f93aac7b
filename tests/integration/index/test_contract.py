"""The same assertions against the in-process index and the real Redis one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.index.base import PrefixIndex
from gateway.index.memory import MemoryIndex
from gateway.index.redis import RedisIndex
from gateway.settings import PrefixSettings, RedisSettings, RoutingSettings
from tests.conftest import REDIS_URL

MakeIndex = Callable[..., PrefixIndex]
A = [101, 102, 103, 104, 105, 106, 107, 108]
B = [201, 202, 203, 204, 205, 206, 207, 208]


@pytest.fixture(params=["memory", "redis"])
async def make(request: pytest.FixtureRequest, redis_prefix: str) -> AsyncIterator[MakeIndex]:
    """Build started indexes with the given routing settings; all closed afterwards."""
    made: list[PrefixIndex] = []

    def build(**routing: Any) -> PrefixIndex:
        rs = RoutingSettings(**routing)
        ps = PrefixSettings(block_size=16)
        if request.param == "memory":
            index: PrefixIndex = MemoryIndex(rs, ps)
        else:
            from redis.asyncio import Redis

            client = Redis.from_url(REDIS_URL)
            index = RedisIndex(client, RedisSettings(key_prefix=redis_prefix), rs, ps)
        made.append(index)
        return index

    yield build
    for index in made:
        await index.aclose()


async def started(index: PrefixIndex) -> PrefixIndex:
    await index.start()
    return index


async def test_unknown_prefixes_match_nothing(make: MakeIndex) -> None:
    index = await started(make())
    assert await index.lookup("m", A) == {}
    assert await index.lookup("m", []) == {}
    assert await index.size() == 0


async def test_lookup_answers_leading_blocks_per_backend(make: MakeIndex) -> None:
    index = await started(make())
    index.record("m", "b0", A)
    index.record("m", "b1", A[:3])
    index.record("m", "b2", B)
    await index.flush()
    assert await index.lookup("m", A) == {"b0": 8, "b1": 3}
    assert await index.lookup("m", [*A[:5], 999, 998]) == {"b0": 5, "b1": 3}
    assert await index.lookup("m", A[:2]) == {"b0": 2, "b1": 2}
    assert await index.lookup("m", B[:4]) == {"b2": 4}
    assert await index.lookup("other-model", A) == {}
    assert await index.size() == 8 + 3 + 8


async def test_forget_keeps_only_the_leading_blocks(make: MakeIndex) -> None:
    index = await started(make())
    index.record("m", "b0", A)
    index.record("m", "b1", A)
    index.forget("m", "b0", A, keep_blocks=3)
    index.forget("m", "b1", A, keep_blocks=0)
    await index.flush()
    assert await index.lookup("m", A) == {"b0": 3}
    assert await index.size() == 3


async def test_handles_expire_unless_renewed(make: MakeIndex) -> None:
    """Sleeps make the lower bounds certain; the upper one leaves a busy machine 1.4 s."""
    index = await started(make(handle_ttl=2.0))
    index.record("m", "b0", A)
    index.record("m", "b1", B)
    await index.flush()
    await asyncio.sleep(1.5)
    index.record("m", "b0", A[:2])
    await index.flush()
    await asyncio.sleep(0.6)  # B is past its 2 s, A[:2] renewed 0.6 s ago
    assert await index.lookup("m", A) == {"b0": 2}
    assert await index.lookup("m", B) == {}
    assert await index.size() == 2


async def test_capacity_evicts_the_least_recently_used_tails_first(make: MakeIndex) -> None:
    index = await started(make())
    index.bound("b0", 10 * 16)
    index.record("m", "b0", A)
    await index.flush()
    index.record("m", "b0", B)
    index.record("m", "b1", A)
    await index.flush()
    assert await index.lookup("m", A) == {"b0": 2, "b1": 8}
    assert await index.lookup("m", B) == {"b0": 8}
    assert await index.size() == 18
    index.record("m", "b0", A[:4])
    await index.flush()
    assert await index.lookup("m", A) == {"b0": 4, "b1": 8}
    assert await index.lookup("m", B) == {"b0": 6}


async def test_a_renewed_prefix_outlives_its_own_tail(make: MakeIndex) -> None:
    index = await started(make())
    index.bound("b0", 8 * 16)
    index.record("m", "b0", A)
    await index.flush()
    index.record("m", "b0", [*A[:3], *B[:5]])
    await index.flush()
    # The shared first 3 blocks were just used; A's old tail went first.
    assert await index.lookup("m", A) == {"b0": 3}
    assert await index.lookup("m", [*A[:3], *B[:5]]) == {"b0": 8}
