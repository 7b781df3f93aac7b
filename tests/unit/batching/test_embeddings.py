import asyncio

import orjson
import pytest

from gateway.answers import Answer
from gateway.backends import Backend
from gateway.batching.embeddings import (
    EmbeddingBatcher,
    group_key,
    largest_remainder,
    split_response,
    text_inputs,
    weight,
)
from gateway.errors import BadGateway, UpstreamError
from gateway.flow import Call
from gateway.settings import BatchingSettings
from tests.unit.batching.fakes import FakeSend, FakeUpstream, embeddings_call


@pytest.mark.parametrize(
    ("total", "weights", "parts"),
    [
        (10, [1, 1, 1], [4, 3, 3]),
        (10, [1, 2, 2], [2, 4, 4]),
        (7, [5, 0, 5], [4, 0, 3]),
        (3, [0, 0], [2, 1]),
        (0, [3, 4], [0, 0]),
        (100, [33, 33, 34], [33, 33, 34]),
        (5, [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]),
    ],
)
def test_largest_remainder_splits_exactly(total: int, weights: list[int], parts: list[int]) -> None:
    got = largest_remainder(total, weights)
    assert got == parts
    assert sum(got) == total


def test_largest_remainder_gives_the_extra_to_the_largest_remainders() -> None:
    # 11 * (2, 3, 5) / 10 = 2.2, 3.3, 5.5: the floors sum to 10, the one left goes to 5.5.
    assert largest_remainder(11, [2, 3, 5]) == [2, 3, 6]


def upstream_answer(n: int, prompt_tokens: int) -> bytes:
    data = [{"index": i, "object": "embedding", "embedding": [float(i)]} for i in range(n)]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0}
    return orjson.dumps(
        {"id": "embd-1", "object": "list", "model": "m", "data": data[::-1], "usage": usage}
    )


def test_split_gives_each_caller_its_vectors_indexed_from_zero() -> None:
    parts = [orjson.loads(p) for p in split_response(upstream_answer(5, 50), [2, 1, 2], [1, 1, 3])]
    assert [[d["embedding"] for d in p["data"]] for p in parts] == [
        [[0.0], [1.0]],
        [[2.0]],
        [[3.0], [4.0]],
    ]
    assert [[d["index"] for d in p["data"]] for p in parts] == [[0, 1], [0], [0, 1]]
    assert [p["usage"]["prompt_tokens"] for p in parts] == [10, 10, 30]
    assert [p["usage"]["total_tokens"] for p in parts] == [10, 10, 30]
    assert all(p["id"] == "embd-1" and p["object"] == "list" for p in parts)


def test_split_refuses_an_answer_that_does_not_match_the_inputs() -> None:
    with pytest.raises(BadGateway):
        split_response(upstream_answer(3, 10), [2, 2], [1, 1])
    with pytest.raises(BadGateway):
        split_response(b"not json", [1], [1])


def test_text_inputs_and_weights() -> None:
    assert text_inputs("abc") == ["abc"]
    assert text_inputs(["a", "bc"]) == ["a", "bc"]
    assert text_inputs([1, 2, 3]) is None
    assert text_inputs([[1], [2]]) is None
    assert text_inputs([]) is None
    assert weight(["a", "bc"]) == 3


def test_calls_group_by_everything_but_input_and_user() -> None:
    a = {"model": "m", "input": "x", "user": "u1", "encoding_format": "float"}
    b = {"model": "m", "input": ["y", "z"], "user": "u2", "encoding_format": "float"}
    assert group_key(a) == group_key(b)
    assert group_key(a) != group_key({**a, "encoding_format": "base64"})
    assert group_key(a) != group_key({**a, "model": "other"})


def list_answer(n: int) -> FakeUpstream:
    return FakeUpstream(upstream_answer(n, 10 * n))


async def call_in_flight(
    batcher: EmbeddingBatcher, send: FakeSend
) -> asyncio.Task[tuple[Backend, Answer]]:
    """A first call: it finds its group idle and goes at once (held upstream by a gate)."""
    first = asyncio.create_task(batcher.submit(embeddings_call("x"), "up", b"own", send))
    await asyncio.sleep(0)
    return first


async def submit_all(
    batcher: EmbeddingBatcher, calls: list[Call], send: FakeSend
) -> list[tuple[Backend, Answer]]:
    return await asyncio.gather(*(batcher.submit(c, "up", b"own", send) for c in calls))


async def test_an_idle_group_sends_at_once_and_a_busy_one_batches() -> None:
    batcher = EmbeddingBatcher(BatchingSettings(embeddings_window=0.01))
    slow = asyncio.Event()
    send = FakeSend(answers=[FakeUpstream(b"x"), list_answer(3)], gates=[slow])
    first = await call_in_flight(batcher, send)
    assert send.sent[0][1] == b"own", "nothing in flight: sent as it came"
    calls = [embeddings_call("bb"), embeddings_call(["c", "dddd"])]
    got = await submit_all(batcher, calls, send)
    assert len(send.sent) == 2
    assert orjson.loads(send.sent[1][1]) == {"model": "up", "input": ["bb", "c", "dddd"]}
    bodies = [orjson.loads(await answer.read()) for _, answer in got]
    assert [len(b["data"]) for b in bodies] == [1, 2]
    # 30 tokens split 2 : 5 by characters: 8.57 and 21.43, the larger remainder rounds up.
    assert [b["usage"]["prompt_tokens"] for b in bodies] == [9, 21]
    assert [c.served_by for c in calls] == ["upstream", "batched"]
    slow.set()
    await first


async def test_a_full_batch_goes_without_waiting_for_the_window() -> None:
    batcher = EmbeddingBatcher(BatchingSettings(embeddings_window=5.0, embeddings_max_batch=4))
    slow = asyncio.Event()
    send = FakeSend(answers=[FakeUpstream(b"x"), list_answer(4)], gates=[slow])
    first = await call_in_flight(batcher, send)
    calls = [embeddings_call(["a", "b"]), embeddings_call(["c", "d"]), embeddings_call("e")]
    got = await asyncio.wait_for(submit_all(batcher, calls[:2], send), 1.0)
    assert [len(orjson.loads(await a.read())["data"]) for _, a in got] == [2, 2]
    last = asyncio.create_task(batcher.submit(calls[2], "up", b"own", send))
    await asyncio.sleep(0.01)
    assert not last.done(), "a batch that is not full waits for its window"
    await batcher.aclose()
    with pytest.raises(BadGateway):  # closing answers every waiting call
        await last
    slow.set()
    await first


async def test_a_refused_batch_is_resent_call_by_call() -> None:
    batcher = EmbeddingBatcher(BatchingSettings(embeddings_window=0.01))
    refused = UpstreamError(400, b'{"error": {"message": "too long"}}')
    slow = asyncio.Event()
    send = FakeSend(answers=[FakeUpstream(b"x")], errors=[], gates=[slow])
    first = await call_in_flight(batcher, send)
    send.errors = [refused]
    calls = [embeddings_call("a"), embeddings_call("b")]
    got = await submit_all(batcher, calls, send)
    assert [payload for _, payload, _ in send.sent[2:]] == [b"own", b"own"]
    assert [await a.read() for _, a in got] == [b"answer", b"answer"]
    slow.set()
    await first


async def test_a_batch_goes_when_the_call_in_flight_returns() -> None:
    batcher = EmbeddingBatcher(BatchingSettings(embeddings_window=5.0))
    slow = asyncio.Event()
    send = FakeSend(answers=[FakeUpstream(b"x"), list_answer(2)], gates=[slow])
    first = await call_in_flight(batcher, send)
    waiting = asyncio.create_task(
        submit_all(batcher, [embeddings_call("a"), embeddings_call("b")], send)
    )
    await asyncio.sleep(0.01)
    assert len(send.sent) == 1, "collecting while the first call is upstream"
    slow.set()
    got = await asyncio.wait_for(waiting, 1.0)  # long before the 5 s window ends
    assert len(send.sent) == 2
    assert [len(orjson.loads(await a.read())["data"]) for _, a in got] == [1, 1]
    await first
