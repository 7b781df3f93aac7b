from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.sim import tokenizer
from gateway.sim.config import SimConfig
from gateway.sim.engine import Engine, Sequence

FAST = SimConfig(step_ms=1.0, prefill_token_ms=0.001, decode_seq_ms=0.0)


@pytest.fixture
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
    config = getattr(request, "param", FAST)
    e = Engine(config)
    e.start()
    yield e
    await e.aclose()


async def finish(seq: Sequence) -> Sequence:
    while seq.finish_reason is None:
        await asyncio.wait_for(seq.tokens(), 5)
    return seq


def words(n: int, tag: str = "w") -> list[int]:
    return tokenizer.encode(" ".join(f"{tag}{i}" for i in range(n)))


async def test_a_repeated_prompt_hits_whole_blocks_except_the_last_token(engine: Engine) -> None:
    prompt = words(100)
    first = await finish(engine.submit(prompt, 4))
    assert first.cached_tokens == 0
    assert first.created_cache_tokens == 96  # prompt blocks only, not the answer's
    assert first.finish_reason == "length"
    assert len(first.output) == 4
    again = await finish(engine.submit(prompt, 4))
    assert again.cached_tokens == 96
    assert again.created_cache_tokens == 0
    assert again.output == first.output  # same prompt, same answer
    aligned = await finish(engine.submit(prompt[:96], 1))
    assert aligned.cached_tokens == 80  # 96 tokens cached, but the last one is recomputed
    assert engine.stats.prefix_hits == 96 + 80
    assert engine.stats.prefix_queries == 100 + 100 + 96


async def test_without_max_tokens_the_answer_stops_at_the_default_length(engine: Engine) -> None:
    seq = await finish(engine.submit(words(5), None))
    assert seq.finish_reason == "stop"
    assert len(seq.output) == FAST.default_max_tokens


async def test_the_answer_is_cached_for_the_next_turn(engine: Engine) -> None:
    prompt = words(40)
    seq = await finish(engine.submit(prompt, 30))
    answer = [tokenizer.GENERATED_IDS[i] for i in seq.output]
    follow = prompt + answer + words(10, "next")
    nxt = await finish(engine.submit(follow, 1))
    # 40 + 29 tokens have KV (the last sampled token never does): 4 full blocks.
    assert nxt.cached_tokens == 64
    assert nxt.cached_tokens > len(prompt)


@pytest.mark.parametrize("engine", [SimConfig(cache_blocks=24, step_ms=1.0)], indirect=True)
async def test_lru_eviction_makes_an_old_prefix_miss(engine: Engine) -> None:
    old = words(160, "old")
    await finish(engine.submit(old, 1))
    assert (await finish(engine.submit(old, 1))).cached_tokens == 144
    for tag in ("a", "b", "c"):  # 3 x 11 blocks through a 24-block cache
        await finish(engine.submit(words(160, tag), 1))
    assert (await finish(engine.submit(old, 1))).cached_tokens == 0


@pytest.mark.parametrize("engine", [SimConfig(max_num_seqs=1, step_ms=1.0)], indirect=True)
async def test_requests_beyond_max_num_seqs_wait(engine: Engine) -> None:
    a = engine.submit(words(10, "a"), 20)
    b = engine.submit(words(10, "b"), 20)
    await asyncio.wait_for(a.tokens(), 5)
    assert engine.running == [a]
    assert list(engine.waiting) == [b]
    await finish(a)
    await finish(b)
    assert not engine.running
    assert not engine.waiting


async def test_abort_unpins_blocks_and_is_counted(engine: Engine) -> None:
    seq = engine.submit(words(200), 10_000)
    await asyncio.wait_for(seq.tokens(), 5)
    assert engine.cache.used > 0
    engine.abort(seq)
    assert seq.finish_reason == "abort"
    assert engine.running == []
    assert engine.cache.used == 0
    assert engine.stats.aborted == 1
    # Its prompt blocks were computed, so they stay cached for others.
    assert (await finish(engine.submit(words(200), 1))).cached_tokens > 0


async def test_uncached_prefill_costs_time_and_a_cached_one_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine's modelled step times (what it sleeps), not the wall clock: a loaded
    machine stretches sleeps, never the model."""
    slept: list[float] = []
    sleep = asyncio.sleep

    async def recorded(seconds: float) -> None:
        slept.append(seconds)
        await sleep(0)

    e = Engine(SimConfig())  # the defaults the CLI documents
    e.start()
    try:
        prompt = words(2000)
        monkeypatch.setattr(asyncio, "sleep", recorded)
        cold = await finish(e.submit(prompt, 1))
        cold_s, slept[:] = sum(slept), []
        warm = await finish(e.submit(prompt, 1))
        warm_s = sum(slept)
    finally:
        monkeypatch.undo()
        await e.aclose()
    assert (cold.cached_tokens, warm.cached_tokens) == (0, 1984)
    # Four chunked-prefill steps of 512 tokens cost at least 4 x 12 + 2,000 x 0.1 ms.
    assert cold_s > 0.24
    assert warm_s < cold_s / 3


async def test_instant_mode_answers_on_submit_with_the_same_cache() -> None:
    e = Engine(SimConfig(instant=True))
    prompt = words(50)
    first = e.submit(prompt, 3)
    assert first.finish_reason == "length"
    assert len(first.output) == 3
    assert e.submit(prompt, 3).cached_tokens == 48
