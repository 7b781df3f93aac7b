import pytest

from gateway.errors import InvalidRequest
from gateway.stages.parse import parse

CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def test_chat_request_fields() -> None:
    req = parse(
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true,'
        b' "stream_options": {"include_usage": true}, "max_tokens": 7, "temperature": 0,'
        b' "user": "u1"}',
        "chat",
    )
    assert (req.model, req.stream, req.include_usage, req.max_tokens) == ("m", True, True, 7)
    assert req.deterministic
    assert req.session == "u1"


def test_session_header_wins_over_user_field() -> None:
    req = parse(CHAT, "chat", session_header="s9")
    assert req.session == "s9"
    assert not req.stream
    assert not req.include_usage


def test_include_usage_only_counts_when_streaming() -> None:
    req = parse(
        b'{"model":"m","prompt":"x","stream_options":{"include_usage":true}}', "completions"
    )
    assert not req.include_usage


@pytest.mark.parametrize(
    ("body", "endpoint", "param"),
    [
        (b"{not json", "chat", None),
        (b"[1, 2]", "chat", None),
        (b'{"messages": []}', "chat", "model"),
        (b'{"model": "m"}', "chat", "messages"),
        (b'{"model": "m", "messages": []}', "chat", "messages"),
        (b'{"model": "m", "messages": ["hi"]}', "chat", "messages"),
        (b'{"model": "m"}', "completions", "prompt"),
        (b'{"model": "m"}', "embeddings", "input"),
        (b'{"model": "m", "prompt": "x", "max_tokens": 0}', "completions", "max_tokens"),
        (b'{"model": "m", "prompt": "x", "max_tokens": "9"}', "completions", "max_tokens"),
        (b'{"model": "m", "prompt": "x", "stream": "yes"}', "completions", "stream"),
        (b'{"model": "m", "prompt": "x", "stream_options": 3}', "completions", "stream_options"),
    ],
)
def test_bad_requests_name_the_parameter(body: bytes, endpoint: str, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(body, endpoint)  # type: ignore[arg-type]
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.body()["error"]["type"] == "invalid_request_error"
