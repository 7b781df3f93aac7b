import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.flow import Endpoint
from gateway.stages.parse import client_request_id, parse

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


def test_prompt_cache_key_is_a_session_between_the_header_and_user() -> None:
    body = b'{"model": "m", "prompt": "x", "prompt_cache_key": "agent-7", "user": "u1"}'
    assert parse(body, "completions").session == "agent-7"
    assert parse(body, "completions", session_header="s9").session == "s9"
    empty = b'{"model": "m", "prompt": "x", "prompt_cache_key": "", "user": "u1"}'
    assert parse(empty, "completions").session == "u1"
    assert parse(body, "completions").body["prompt_cache_key"] == "agent-7"  # forwarded as is


def test_a_prompt_cache_key_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(InvalidRequest) as err:
        parse(b'{"model": "m", "prompt": "x", "prompt_cache_key": 7}', "completions")
    assert err.value.param == "prompt_cache_key"


def test_the_end_user_is_the_safety_identifier_else_the_user() -> None:
    both = b'{"model": "m", "prompt": "x", "safety_identifier": "h-42", "user": "u1"}'
    assert parse(both, "completions").end_user == "h-42"
    assert parse(both, "completions").body["safety_identifier"] == "h-42"  # forwarded
    assert parse(b'{"model": "m", "prompt": "x", "user": "u1"}', "completions").end_user == "u1"
    assert parse(b'{"model": "m", "prompt": "x"}', "completions").end_user is None


@pytest.mark.parametrize("value", ["7", "true", '"a\\u0000b"', '"' + "x" * 257 + '"'])
def test_a_safety_identifier_that_is_no_name_is_refused(value: str) -> None:
    body = f'{{"model": "m", "prompt": "x", "safety_identifier": {value}}}'.encode()
    with pytest.raises(InvalidRequest) as err:
        parse(body, "completions")
    assert err.value.param == "safety_identifier"


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
        (b'{"model": "m", "messages": ["hi"]}', "chat", "messages[0]"),
        (b'{"model": "m"}', "completions", "prompt"),
        (b'{"model": "m"}', "embeddings", "input"),
        (b'{"model": "m", "prompt": "x", "max_tokens": 0}', "completions", "max_tokens"),
        (b'{"model": "m", "prompt": "x", "max_tokens": "9"}', "completions", "max_tokens"),
        (b'{"model": "m", "prompt": "x", "stream": "yes"}', "completions", "stream"),
        (b'{"model": "m", "prompt": "x", "stream_options": 3}', "completions", "stream_options"),
    ],
)
def test_bad_requests_name_the_parameter(
    body: bytes, endpoint: Endpoint, param: str | None
) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(body, endpoint)
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "session", "param"),
    [
        (b'{"model": "a\\u0000b", "prompt": "x"}', None, "model"),
        (b'{"model": "a\\nb", "prompt": "x"}', None, "model"),
        (b'{"model": "a\\u0085b", "prompt": "x"}', None, "model"),
        (b'{"model": "a\\u007fb", "prompt": "x"}', None, "model"),
        (b'{"model": "' + b"m" * 201 + b'", "prompt": "x"}', None, "model"),
        (b'{"model": "m", "prompt": "x", "user": "u\\u0000"}', None, "user"),
        (b'{"model": "m", "prompt": "x", "user": "' + b"u" * 257 + b'"}', None, "user"),
        (b'{"model": "m", "prompt": "x"}', "s\x00", "x-session-id"),
        (b'{"model": "m", "prompt": "x"}', "s" * 257, "x-session-id"),
        # the user field is checked even when the header names the session
        (b'{"model": "m", "prompt": "x", "user": "u\\u001b"}', "s", "user"),
    ],
)
def test_names_the_ledger_or_the_router_keeps_must_be_storable(
    body: bytes, session: str | None, param: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(body, "completions", session_header=session)
    assert (info.value.status, info.value.param) == (400, param)
    assert "\x00" not in info.value.message
    assert "mmmm" not in info.value.message


def test_longest_names_and_unicode_names_pass() -> None:
    model = "m" * 200
    body = orjson.dumps({"model": model, "prompt": "x", "user": "Zoë-ユーザー-" + "u" * 240})
    req = parse(body, "completions", session_header="s" * 256)
    assert (req.model, req.session) == (model, "s" * 256)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({}, None), ({"x-request-id": ""}, None), ({"x-request-id": "req-1 abc"}, "req-1 abc"),
     ({"x-request-id": "r" * 128}, "r" * 128)],
)  # fmt: skip
def test_client_request_id(headers: dict[str, str], expected: str | None) -> None:
    assert client_request_id(headers) == expected


@pytest.mark.parametrize("value", ["r" * 129, "a\x00b", "a\tb", "caf\xe9", "a\x85"])
def test_client_request_id_must_be_short_printable_ascii(value: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        client_request_id({"x-request-id": value})
    assert (info.value.status, info.value.param) == (400, "x-request-id")


def test_embeddings_never_stream() -> None:
    """A stream flag on embeddings is the backend's to judge: the answer is one JSON body."""
    req = parse(b'{"model": "m", "input": "x", "stream": true}', "embeddings")
    assert not req.stream


def test_a_responses_call_reads_input_instructions_and_max_output_tokens() -> None:
    body = {"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 7}
    req = parse(orjson.dumps({**body, "stream": True}), "responses")
    assert (req.endpoint, req.max_tokens, req.stream) == ("responses", 7, True)
    assert req.include_usage  # response.completed always carries it
    assert not req.deterministic  # never coalesced: each answer is its own response


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": 3}, "input"),
        ({"model": "m", "input": ["hi"]}, "input[0]"),
        ({"model": "m", "input": [{"role": 1, "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"role": "user", "content": 5}]}, "input[0].content"),
        ({"model": "m", "input": [{"role": "user", "content": ["x"]}]}, "input[0].content[0]"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
         "input[0].content[0].text"),
        ({"model": "m", "input": "x", "instructions": ["a"]}, "instructions"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ],
)  # fmt: skip
def test_a_responses_call_the_gateway_cannot_read_is_refused_naming_the_field(
    body: dict[str, object], param: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse(orjson.dumps(body), "responses")
    assert err.value.param == param


def test_responses_items_the_gateway_does_not_read_pass_to_the_backend() -> None:
    call = {"type": "function_call_output", "call_id": "c1", "output": "42"}
    req = parse(orjson.dumps({"model": "m", "input": [call]}), "responses")
    assert req.body["input"] == [call]
