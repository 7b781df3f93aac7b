from __future__ import annotations

from gateway.flow import PrefixKey
from gateway.index.feedback import held_blocks, observe
from gateway.index.memory import MemoryIndex
from gateway.settings import PrefixSettings, RoutingSettings

KEY = PrefixKey(tokens=160, hashes=list(range(1, 11)), block_size=16, anchor=0)


def index() -> MemoryIndex:
    return MemoryIndex(RoutingSettings(), PrefixSettings(block_size=16))


def test_shares_translate_backend_tokens_into_gateway_blocks() -> None:
    # The backend's tokenizer counts 200 tokens where the gateway counts 160.
    assert held_blocks(KEY, reported_cached=100, reported_prompt=200) == 5
    assert held_blocks(KEY, reported_cached=0, reported_prompt=200) == 0
    assert held_blocks(KEY, reported_cached=500, reported_prompt=200) == 10


async def test_a_reported_call_renews_the_whole_prompt_and_reports_a_shortfall() -> None:
    idx = index()
    idx.record("m", "b0", KEY.hashes[:6])
    fb = observe(idx, "m", "b0", KEY, predicted_blocks=6, reported_cached=64, reported_prompt=200)
    assert fb.held_blocks == 3
    assert fb.overestimated
    assert await idx.lookup("m", KEY.hashes) == {"b0": 10}
    exact = observe(idx, "m", "b0", KEY, 10, reported_cached=200, reported_prompt=200)
    assert not exact.overestimated


async def test_a_call_without_usage_withdraws_the_dispatch_record() -> None:
    idx = index()
    idx.record("m", "b0", KEY.hashes[:4])
    idx.record("m", "b0", KEY.hashes)  # at dispatch
    fb = observe(idx, "m", "b0", KEY, 4, reported_cached=None, reported_prompt=None)
    assert not fb.reported
    assert await idx.lookup("m", KEY.hashes) == {"b0": 4}


async def test_the_reply_is_recorded_with_the_prompt() -> None:
    idx = index()
    after = PrefixKey(tokens=400, hashes=[*KEY.hashes, *range(50, 65)], block_size=16, anchor=0)
    fb = observe(idx, "m", "b0", KEY, 0, reported_cached=0, reported_prompt=200, holds=after)
    assert fb.held_blocks == 0
    assert await idx.lookup("m", after.hashes) == {"b0": 25}
