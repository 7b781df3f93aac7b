import asyncio
from typing import Any

from gateway.batching.coalesce import Coalescer, coalesce_key, own_copy
from gateway.errors import UpstreamError
from gateway.flow import Endpoint, Request
from tests.unit.batching.fakes import FakeSend, FakeUpstream, chat_call


def request(endpoint: Endpoint = "chat", **body: Any) -> Request:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    stream = body.get("stream") is True
    deterministic = body.get("temperature") == 0 and body.get("n", 1) == 1
    return Request(endpoint, "m", body, stream=stream, deterministic=deterministic)


def test_only_deterministic_calls_have_a_key() -> None:
    assert coalesce_key(request(temperature=0)) is not None
    assert coalesce_key(request(temperature=0.5)) is None
    assert coalesce_key(request()) is None


def test_the_key_ignores_what_does_not_change_the_answer() -> None:
    base = coalesce_key(request(temperature=0, max_tokens=5))
    assert base == coalesce_key(request(max_tokens=5, temperature=0, user="someone"))
    streamed = coalesce_key(request(temperature=0, max_tokens=5, stream=True))
    assert streamed != base
    assert streamed == coalesce_key(
        request(temperature=0, max_tokens=5, stream=True, stream_options={"include_usage": True})
    )


def test_the_key_follows_everything_that_does() -> None:
    base = coalesce_key(request(temperature=0, max_tokens=5))
    assert base != coalesce_key(request(temperature=0, max_tokens=6))
    assert base != coalesce_key(request(temperature=0, max_tokens=5, logprobs=True))
    other = request(temperature=0, max_tokens=5)
    other.body["messages"] = [{"role": "user", "content": "hi!"}]
    assert base != coalesce_key(other)
    completion = request("completions", temperature=0, max_tokens=5)
    assert base != coalesce_key(completion)


def test_each_caller_gets_its_own_copy_of_an_error() -> None:
    exc = UpstreamError(400, b'{"error": {}}')
    exc.headers["x-request-id"] = "leader"
    clone = own_copy(exc)
    clone.headers["x-request-id"] = "follower"
    assert exc.headers["x-request-id"] == "leader"
    assert (clone.status, clone.json(), type(clone)) == (400, b'{"error": {}}', UpstreamError)


async def test_followers_share_the_leaders_answer_and_error() -> None:
    coalescer = Coalescer()
    send = FakeSend(errors=[UpstreamError(400, b'{"error": {"message": "bad"}}')])
    calls = [chat_call(temperature=0) for _ in range(3)]
    results = await asyncio.gather(
        *(coalescer.submit(c, b"k", b"body", lambda c, p: send(c, p, None)) for c in calls),
        return_exceptions=True,
    )
    assert len(send.sent) == 1
    assert all(
        isinstance(r, UpstreamError) and r.raw == b'{"error": {"message": "bad"}}' for r in results
    )
    assert len({id(r) for r in results}) == 3, "each caller gets its own error object"
    answers = await asyncio.gather(
        *(coalescer.submit(c, b"k", b"body", lambda c, p: send(c, p, None)) for c in calls)
    )
    assert len(send.sent) == 2
    assert [await a.read() for _, a in answers] == [b"answer"] * 3
    assert [c.served_by for c in calls] == ["upstream", "coalesced", "coalesced"]
    assert all(c.route == calls[0].route for c in calls)


async def test_an_abandoned_answer_is_not_joined() -> None:
    coalescer, first = Coalescer(), FakeUpstream()
    send = FakeSend(answers=[first])
    forward = lambda c, p: send(c, p, None)  # noqa: E731
    leader = chat_call(temperature=0, stream=True)
    _, answer = await coalescer.submit(leader, b"k", b"body", forward)
    answer.close()  # its only listener leaves mid-answer: the upstream call is cancelled
    await asyncio.sleep(0.01)
    assert first.closed
    late = chat_call(temperature=0, stream=True)
    _, fresh = await coalescer.submit(late, b"k", b"body", forward)
    assert len(send.sent) == 2
    assert late.served_by == "upstream"
    assert await fresh.read() == b"answer"


async def test_a_leader_whose_client_left_hands_the_call_to_a_follower() -> None:
    """The leader's task is cancelled (its client disconnected before the answer began):
    the followers still want the answer, so the next of them sends the call anew."""
    coalescer, gate = Coalescer(), asyncio.Event()
    send = FakeSend(gates=[gate])
    forward = lambda c, p: send(c, p, None)  # noqa: E731
    leader, follower = chat_call(temperature=0), chat_call(temperature=0)
    leading = asyncio.create_task(coalescer.submit(leader, b"k", b"body", forward))
    await asyncio.sleep(0)  # the leader runs up to its backend's gate
    assert len(send.sent) == 1
    following = asyncio.create_task(coalescer.submit(follower, b"k", b"body", forward))
    await asyncio.sleep(0)
    leading.cancel()
    _, answer = await following
    assert await answer.read() == b"answer"
    assert [c for c, _, _ in send.sent] == [leader, follower]
    assert follower.served_by == "upstream"
    assert leading.cancelled()
