"""The runner against a scripted server: order, history, headers, bounds, comparison."""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

import pytest

from gateway.bench import runner
from gateway.bench.client import Target
from gateway.bench.workloads import MultiTurn, SharedPrefix, Tiny
from tests.unit.bench.fake_backend import fake_backend


def answer_of(n: int, max_tokens: int) -> str:
    """What the fake answers to the n-th request it receives (1-based)."""
    return "".join(f"a{n}.{i} " for i in range(max_tokens))


async def test_multi_turn_resends_history_with_the_actual_answers() -> None:
    workload = MultiTurn(conversations=2, turns_per_conversation=3, max_tokens=2)
    opts = runner.Options(concurrency=4, session_header=True)
    async with fake_backend() as fake:
        report = await runner.run(workload, Target(fake.base_url), opts)
    assert (report.requests, report.ok) == (6, 6)
    answers = {
        body["messages"][-1]["content"]: answer_of(n, 2)
        for n, body in enumerate(fake.received, start=1)
    }
    for body, headers in zip(fake.received, fake.headers, strict=True):
        messages: list[dict[str, Any]] = body["messages"]
        assert messages[0]["role"] == "system"
        turn = (len(messages) - 2) // 2
        assert len(messages) == 2 + 2 * turn
        for user, assistant in zip(messages[1:-1:2], messages[2:-1:2], strict=True):
            assert user["role"] == "user"
            assert assistant == {"role": "assistant", "content": answers[user["content"]]}
        assert headers["x-session-id"].startswith("mt-w0-c")
    assert sorted(len(b["messages"]) for b in fake.received) == [2, 2, 4, 4, 6, 6]


async def test_request_body_and_model_from_the_models_list() -> None:
    async with fake_backend() as fake:
        report = await runner.run(Tiny(max_tokens=3), Target(fake.base_url),
                                  runner.Options(requests=5, concurrency=2))  # fmt: skip
    body = fake.received[0]
    assert body["model"] == "fake-model" == report.model
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0
    assert body["max_tokens"] == 3
    assert body["ignore_eos"] is True
    assert "x-session-id" not in fake.headers[0]
    assert report.requests == 5
    assert report.instances == {"fake-1": 5}
    assert report.output_tokens == 15


async def test_same_seed_same_requests_and_warmup_is_not_counted() -> None:
    workload = SharedPrefix(groups=2, questions=3, prefix_words=20)
    got = []
    for _ in range(2):
        async with fake_backend() as fake:
            opts = runner.Options(seed=5, warmup=3, model="m", concurrency=3)
            report = await runner.run(workload, Target(fake.base_url), opts)
        assert report.requests == 6
        assert len(fake.received) == 9
        got.append((report.mix_digest, sorted(str(b["messages"]) for b in fake.received[3:])))
    assert got[0] == got[1]


async def test_rate_and_duration_bound_the_run() -> None:
    async with fake_backend() as fake:
        t0 = time.perf_counter()
        report = await runner.run(
            Tiny(), Target(fake.base_url), runner.Options(rate=50, duration=0.5, model="m")
        )
        took = time.perf_counter() - t0
    assert took < 10.0  # ends by its duration (unbounded, it would run on)
    assert 5 <= report.requests <= 60
    assert report.load == "rate=50/s"


async def test_compare_sends_the_same_stream_to_every_target_tagged() -> None:
    async with fake_backend() as a, fake_backend() as b:
        reports = await runner.compare(
            SharedPrefix(groups=2, questions=2, prefix_words=10),
            [Target(a.base_url, "a"), Target(b.base_url, "b")],
            runner.Options(rate=40, model="m"),
        )
    assert [r.target for r in reports] == ["a", "b"]
    assert reports[0].mix_digest == reports[1].mix_digest
    assert [r.requests for r in reports] == [4, 4]

    def firsts(received: list[dict[str, Any]], tag: str) -> list[str]:
        contents = sorted(body["messages"][0]["content"] for body in received)
        assert all(c.startswith(tag) for c in contents)
        return [c.removeprefix(tag) for c in contents]

    assert firsts(a.received, "[T0] ") == firsts(b.received, "[T1] ")


def test_options_refuse_both_loads() -> None:
    with pytest.raises(ValueError, match="not both"):
        runner.Options(concurrency=2, rate=1.0)
    with pytest.raises(ValueError, match="positive"):
        runner.Options(rate=0)
    assert runner.Options().load == "concurrency=8"


def test_arrivals_double_inside_bursts_and_are_replayable() -> None:
    bursts = runner.Bursts(start=10, every=20, length=10, factor=2)
    offsets = list(itertools.takewhile(lambda t: t < 2000, runner.arrival_offsets(5, 3, bursts)))
    inside = sum(bursts.factor_at(t) == 2 for t in offsets)
    outside = len(offsets) - inside
    # 1,000 s of each: ~10,000 arrivals inside and ~5,000 outside
    assert 1.9 < inside / outside < 2.1
    assert 4800 < outside < 5200
    again = itertools.takewhile(lambda t: t < 2000, runner.arrival_offsets(5, 3, bursts))
    assert list(again) == offsets


def test_arrivals_without_bursts_are_the_plain_poisson_stream() -> None:
    plain = random.Random("3:arrivals")
    expected = list(itertools.accumulate(plain.expovariate(5) for _ in range(100)))
    got = list(itertools.islice(runner.arrival_offsets(5, 3), 100))
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("bad", [{"length": 0}, {"every": 5, "length": 10}, {"factor": 0.5}])
def test_bursts_refuse_impossible_schedules(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="bursts need"):
        runner.Bursts(**bad)
