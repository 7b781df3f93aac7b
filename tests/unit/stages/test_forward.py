import orjson

from gateway.flow import Call, Request, Usage
from gateway.stages.forward import EventScanner, upstream_body

CHUNK = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}'
USAGE = (
    b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,'
    b'"prompt_tokens_details":{"cached_tokens":32}}}'
)
DONE = b"data: [DONE]"
STREAM = b"\n\n".join([CHUNK, CHUNK, USAGE, DONE]) + b"\n\n"


def scan(strip: bool, pieces: list[bytes]) -> tuple[bytes, Call]:
    call = Call(id="r", path="/v1/chat/completions")
    scanner = EventScanner(call, strip_usage=strip)
    out = b"".join(scanner.feed(p) for p in pieces) + scanner.tail()
    return out, call


def test_usage_event_removed_for_a_client_that_did_not_ask() -> None:
    out, call = scan(True, [STREAM])
    assert out == b"\n\n".join([CHUNK, CHUNK, DONE]) + b"\n\n"
    assert call.usage == Usage(prompt_tokens=40, cached_tokens=32, completion_tokens=2)


def test_usage_event_kept_byte_for_byte_for_a_client_that_asked() -> None:
    out, call = scan(False, [STREAM])
    assert out == STREAM
    assert call.usage is not None


def test_events_split_across_network_reads() -> None:
    pieces = [STREAM[i : i + 7] for i in range(0, len(STREAM), 7)]
    out, call = scan(True, pieces)
    assert out == b"\n\n".join([CHUNK, CHUNK, DONE]) + b"\n\n"
    assert call.usage is not None
    assert call.usage.cached_tokens == 32


def test_continuous_usage_chunks_are_never_dropped() -> None:
    chunk = b'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":4}}\n\n'
    out, call = scan(True, [chunk])
    assert out == chunk
    assert call.usage == Usage(prompt_tokens=4)


def _request(body: dict, stream: bool, include_usage: bool) -> Request:
    return Request("chat", "m", body, stream=stream, include_usage=include_usage)


def test_body_forwarded_untouched_when_nothing_changes() -> None:
    raw = b'{"model":"m","messages":[]}'
    assert upstream_body(_request({"model": "m"}, False, False), "m", raw) is raw
    assert upstream_body(_request({"model": "m"}, True, True), "m", raw) is raw


def test_stream_always_asks_for_usage_and_model_is_renamed() -> None:
    body = {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": False}}
    out = orjson.loads(upstream_body(_request(body, True, False), "served-m", b""))
    assert out["model"] == "served-m"
    assert out["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert body["stream_options"] == {"continuous_usage_stats": False}


def test_a_long_stream_holds_its_reply_as_text_not_as_events() -> None:
    call = Call(id="r", path="/v1/chat/completions")
    scanner = EventScanner(call, strip_usage=True)
    words = [f"w{i} " for i in range(5000)]
    for w in words:
        event = orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": {"content": w}}]})
        scanner.feed(b"data: " + event + b"\n\n")
        assert sum(map(len, scanner.delivered)) <= EventScanner.RAW_KEPT
    assert scanner.reply() == "".join(words)
