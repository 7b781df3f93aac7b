import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.answers import Answer
from gateway.batching.hold import FirstToken, PrefixHold, TokenWatch, shared_blocks
from gateway.errors import BadGateway
from gateway.flow import Call, PrefixKey, Request
from gateway.settings import BatchingSettings
from gateway.stages.sse import carries_token
from tests.unit.batching.fakes import FakeSend, FakeUpstream, chat_call

FIXTURES = Path(__file__).parents[2] / "vllm" / "fixtures"


def event(data: object) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def chunk(
    delta: dict[str, Any] | None = None, text: str | None = None, finish: str | None = None
) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    if text is not None:
        choice["text"] = text
    return event({"object": "chunk", "choices": [choice]})


def test_a_role_only_opening_is_not_a_token() -> None:
    assert not carries_token(chunk({"role": "assistant", "content": ""}).strip())
    assert carries_token(chunk({"content": " the"}).strip())
    assert carries_token(chunk({"tool_calls": [{"index": 0}]}).strip())
    assert carries_token(chunk(text=" the").strip())
    assert carries_token(chunk({}, finish="length").strip())
    assert carries_token(b"data: [DONE]")
    assert not carries_token(event({"error": {"message": "x"}}).strip())


def test_first_token_is_found_across_chunk_boundaries() -> None:
    finder = FirstToken()
    stream = chunk({"role": "assistant", "content": ""}) + chunk({"content": " word"})
    cut = len(stream) - 10
    assert not finder.feed(stream[:cut])
    assert finder.feed(stream[cut:])


def call_with_prefix(hashes: list[int], block_size: int = 16) -> Call:
    call = Call(id="c", path="/v1/chat/completions")
    call.request = Request("chat", "m", {})
    call.prefix = PrefixKey(tokens=len(hashes) * block_size, hashes=hashes, block_size=block_size)
    return call


def test_the_hold_key_names_the_first_hold_min_tokens() -> None:
    hold = PrefixHold(BatchingSettings(hold_min_tokens=40))  # 3 blocks of 16
    assert hold.key(call_with_prefix([1, 2])) is None
    assert hold.key(call_with_prefix([1, 2, 3])) == ("m", 3)
    assert hold.key(call_with_prefix([1, 2, 3, 4, 5])) == ("m", 3)
    assert hold.key(call_with_prefix([1, 2, 9, 4])) != hold.key(call_with_prefix([1, 2, 3, 4]))


@pytest.mark.parametrize("piped", [False, True])
async def test_followers_wait_for_the_leaders_first_token_then_follow_it(piped: bool) -> None:
    hold, leader_answer = PrefixHold(BatchingSettings(hold_min_tokens=32)), FakeUpstream()
    send = FakeSend(decision="miss", answers=[leader_answer])
    leader_call = chat_call([1, 2, 3])
    backend, answer = await hold.submit(leader_call, b"lead", send)
    followers = [chat_call([1, 2, 4]) for _ in range(2)]
    waiting = [asyncio.create_task(hold.submit(c, b"follow", send)) for c in followers]
    relay = asyncio.create_task(collect(answer, piped))
    leader_answer.queue.put_nowait(chunk({"role": "assistant", "content": ""}))
    await asyncio.sleep(0.01)
    assert len(send.sent) == 1, "released before the prefix was computed"
    leader_answer.queue.put_nowait(chunk({"content": " the"}))
    await asyncio.gather(*waiting)
    assert [pin for _, _, pin in send.sent[1:]] == [backend.name, backend.name]
    assert [c.served_by for c in followers] == ["held", "held"]
    assert leader_call.served_by == "upstream"
    leader_answer.queue.put_nowait(None)
    assert await relay == chunk({"role": "assistant", "content": ""}) + chunk({"content": " the"})


@pytest.mark.parametrize("piped", [False, True])
async def test_a_failed_leader_releases_followers_to_normal_routing(piped: bool) -> None:
    hold, leader_answer = PrefixHold(BatchingSettings(hold_min_tokens=32)), FakeUpstream()
    send = FakeSend(decision="miss", answers=[leader_answer])
    _, answer = await hold.submit(chat_call([1, 2]), b"lead", send)
    follower = chat_call([1, 2])
    waiting = asyncio.create_task(hold.submit(follower, b"follow", send))
    leader_answer.queue.put_nowait(BadGateway("broke"))
    with pytest.raises(BadGateway):
        await collect(answer, piped)
    await waiting
    assert send.sent[-1][2] is None
    assert follower.served_by == "upstream"


async def test_the_wait_is_bounded() -> None:
    hold = PrefixHold(BatchingSettings(hold_min_tokens=32, hold_max_wait=0.05))
    send = FakeSend(decision="miss", answers=[FakeUpstream()])
    await hold.submit(chat_call([1, 2]), b"lead", send)  # its answer never comes
    follower = chat_call([1, 2])
    await hold.submit(follower, b"follow", send)
    assert send.sent[-1][2] is None
    assert follower.served_by == "upstream"


async def test_a_warm_prefix_holds_nobody() -> None:
    hold = PrefixHold(BatchingSettings(hold_min_tokens=32))
    send = FakeSend(decision="hit", answers=[FakeUpstream()])
    leading = asyncio.create_task(hold.submit(chat_call([1, 2]), b"lead", send))
    follower = chat_call([1, 2])
    await asyncio.gather(leading, hold.submit(follower, b"follow", send))
    assert send.sent[-1][2] is None
    assert follower.served_by == "upstream"


async def test_nobody_waits_for_a_leader_routed_to_a_warm_prefix() -> None:
    hold, first_chunk = PrefixHold(BatchingSettings(hold_min_tokens=32)), asyncio.Event()
    send = FakeSend(decision="hit", gates=[first_chunk])
    leading = asyncio.create_task(hold.submit(chat_call([1, 2]), b"lead", send))
    await asyncio.sleep(0)  # routed; its first chunk has not come
    follower = chat_call([1, 2])
    await asyncio.wait_for(hold.submit(follower, b"follow", send), 1.0)
    assert not leading.done()
    assert send.sent[-1][2] is None
    assert follower.served_by == "upstream"
    first_chunk.set()
    await leading


async def collect(answer: Answer, piped: bool = False) -> bytes:
    """The answer's body, read as the relay reads it: by chunks, or piped (one piece
    refused, so the pipe stops once and goes on)."""
    if not piped:
        return b"".join([c async for c in answer.chunks()])
    got: list[bytes] = []

    def deliver(piece: bytes) -> bool:
        got.append(piece)
        return len(got) != 1

    while not await answer.pipe(deliver):
        pass
    return b"".join(got)


async def test_a_leader_past_its_deadline_is_replaced() -> None:
    hold = PrefixHold(BatchingSettings(hold_min_tokens=32, hold_max_wait=0.5))
    send = FakeSend(decision="miss", answers=[FakeUpstream(), FakeUpstream()])
    await hold.submit(chat_call([1, 2]), b"stuck", send)  # never answers
    await asyncio.sleep(0.55)
    _, answer = await hold.submit(chat_call([1, 2]), b"new leader", send)
    assert isinstance(answer, TokenWatch), "it leads (a follower's answer is not watched)"
    follower = chat_call([1, 2])
    waiting = asyncio.create_task(hold.submit(follower, b"follow", send))
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(send.sent) == 2, "the follower waits for the new leader"
    await waiting


async def test_a_call_sharing_only_an_opening_is_not_held() -> None:
    hold = PrefixHold(BatchingSettings(hold_min_tokens=32, hold_min_share=0.5))
    send = FakeSend(decision="miss", answers=[FakeUpstream()])
    await hold.submit(chat_call([1, 2, 3, 4]), b"lead", send)  # never answers
    follower = chat_call([1, 2, 7, 8, 9])  # shares 2 of its 5 blocks
    await asyncio.wait_for(hold.submit(follower, b"follow", send), 1.0)
    assert send.sent[-1][2] is None
    assert follower.served_by == "upstream"
    assert shared_blocks([1, 2, 3], [1, 2, 3, 4]) == 3
    assert shared_blocks([1, 5], [1, 2]) == 1


def test_a_responses_stream_carries_a_token_from_its_first_output_not_its_opening() -> None:
    recorded = json.loads((FIXTURES / "responses_stream.json").read_text())["raw"].encode()
    events = recorded.split(b"\n\n")[:-1]
    carried = [carries_token(e) for e in events]
    assert carried[:2] == [False, False]  # response.created, response.in_progress
    assert carried[2]  # response.output_item.added: the first token is out
    assert carried[-1]  # response.completed
