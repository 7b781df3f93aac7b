from typing import Any

from gateway.batching.coalesce import coalesce_key, own_copy
from gateway.errors import UpstreamError
from gateway.flow import Endpoint, Request


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
