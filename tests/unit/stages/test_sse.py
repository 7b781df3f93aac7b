import json
from pathlib import Path

import orjson
import pytest

from gateway.flow import Usage
from gateway.stages.sse import EventScanner

CHUNK = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}'
USAGE = (
    b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,'
    b'"prompt_tokens_details":{"cached_tokens":32}}}'
)
DONE = b"data: [DONE]"
STREAM = b"\n\n".join([CHUNK, CHUNK, USAGE, DONE]) + b"\n\n"


def scan(strip: bool, pieces: list[bytes]) -> tuple[bytes, EventScanner]:
    scanner = EventScanner(strip_usage=strip)
    out = b"".join(scanner.feed(p) for p in pieces) + scanner.tail()
    return out, scanner


def test_usage_event_removed_for_a_client_that_did_not_ask() -> None:
    out, found = scan(True, [STREAM])
    assert out == b"\n\n".join([CHUNK, CHUNK, DONE]) + b"\n\n"
    assert found.usage == Usage(prompt_tokens=40, cached_tokens=32, completion_tokens=2)


def test_usage_event_kept_byte_for_byte_for_a_client_that_asked() -> None:
    out, found = scan(False, [STREAM])
    assert out == STREAM
    assert found.usage is not None


def test_events_split_across_network_reads() -> None:
    pieces = [STREAM[i : i + 7] for i in range(0, len(STREAM), 7)]
    out, found = scan(True, pieces)
    assert out == b"\n\n".join([CHUNK, CHUNK, DONE]) + b"\n\n"
    assert found.usage is not None
    assert found.usage.cached_tokens == 32


def test_continuous_usage_chunks_are_never_dropped() -> None:
    chunk = b'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":4}}\n\n'
    out, found = scan(True, [chunk])
    assert out == chunk
    assert found.usage == Usage(prompt_tokens=4)


def test_a_long_stream_holds_its_reply_as_text_not_as_events() -> None:
    scanner = EventScanner(strip_usage=True)
    words = [f"w{i} " for i in range(5000)]
    for w in words:
        event = orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": {"content": w}}]})
        scanner.feed(b"data: " + event + b"\n\n")
        assert sum(map(len, scanner.delivered)) <= EventScanner.RAW_KEPT
    assert scanner.reply() == "".join(words)


def test_a_long_stream_nobody_learns_from_keeps_only_its_last_events() -> None:
    """Passed unread; the last events kept are whole, and say what share of the reply
    they hold, so a usage estimated from them scales to the whole."""
    scanner = EventScanner(strip_usage=True, keep_text=False)
    events = []
    for i in range(5000):
        event = orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": {"content": "w "}}]})
        events.append(b"data: " + event + b"\n\n")
        if i % 3 == 0:  # pieces of one and of several events
            scanner.feed(b"".join(events[-3:] if i else events))
        assert sum(map(len, scanner.delivered)) <= EventScanner.RAW_KEPT + len(events[-1]) * 3
    text = scanner.reply()
    assert 0 < len(text) < 2 * 5000
    assert text == "w " * (len(text) // 2)  # whole events only
    fed = len(b"".join(events[: 1 + 3 * (4999 // 3)]))
    assert scanner.reply_share == pytest.approx(len(b"".join(scanner.delivered)) / fed)
    assert len(text) / scanner.reply_share == pytest.approx(2 * (1 + 3 * (4999 // 3)))


def test_an_event_longer_than_what_is_kept_is_not_copied_again_for_every_event_after_it() -> None:
    tries = []

    class Counted(EventScanner):
        def _reduce(self) -> None:
            tries.append(self._held)
            super()._reduce()

    scanner = Counted(strip_usage=True, keep_text=False)
    text = "x" * (4 * 2**20)
    huge = b'data: {"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}]}\n\n'
    small = b'data: {"choices":[{"index":0,"delta":{"content":"w "}}]}\n\n'
    scanner.feed(huge)
    for _ in range(2000):
        scanner.feed(small)
    assert sum(held > 2**20 for held in tries) == 2  # not a 4 MiB copy per small event
    assert sum(map(len, scanner.delivered)) <= EventScanner.RAW_KEPT  # the huge one cut
    assert scanner.reply() == "w " * (len(scanner.reply()) // 2)
    assert scanner.reply_share < 0.01


def test_a_short_stream_nobody_learns_from_keeps_all_its_text() -> None:
    scanner = EventScanner(strip_usage=True, keep_text=False)
    scanner.feed(STREAM)
    assert scanner.reply() == "aa"
    assert scanner.reply_share == 1.0


def test_a_stream_without_usage_finds_none_and_keeps_its_text() -> None:
    out, found = scan(True, [CHUNK + b"\n\n" + DONE + b"\n\n"])
    assert out == CHUNK + b"\n\n" + DONE + b"\n\n"
    assert found.usage is None
    assert found.reply() == "a"


FIXTURES = Path(__file__).parents[2] / "vllm" / "fixtures"


def test_a_responses_streams_first_token_and_end_are_its_output_and_its_completion() -> None:
    """As vLLM streams it (recorded): created and in_progress come before prefill."""
    raw = json.loads((FIXTURES / "responses_stream.json").read_text())["raw"].encode()
    events = [e + b"\n\n" for e in raw.split(b"\n\n")[:-1]]
    scanner = EventScanner(strip_usage=False, watch_tokens=True)
    seen = []
    for event in events:
        assert scanner.feed(event) == event  # relayed untouched, usage included
        seen.append((scanner.token_seen, scanner.ended))
    assert seen[:2] == [(False, False)] * 2
    assert seen[2] == (True, False)  # response.output_item.added, with the first token
    assert seen[-2:] == [(True, False), (True, True)]  # ...then response.completed
    assert scanner.usage is not None
    assert scanner.usage.completion_tokens == 12
    assert scanner.reply().startswith(" changes")


def test_a_chat_streams_first_byte_is_its_first_token_and_done_its_end() -> None:
    scanner = EventScanner(strip_usage=False)
    assert scanner.token_seen  # not watched: vLLM sends the opening with the first token
    scanner.feed(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n')
    assert not scanner.ended
    scanner.feed(b"data: [DONE]\n\n")
    assert scanner.ended


def test_the_usage_chunk_is_found_behind_comments_and_done_in_any_read() -> None:
    """Only the last events of each read are looked at: past a keep-alive comment and
    [DONE] to the usage chunk, whether it came alone or at the end of many events."""
    comment = b": keep-alive"
    stream = b"\n\n".join([CHUNK] * 40 + [USAGE, comment, DONE]) + b"\n\n"
    for pieces in ([stream], [stream[:-100], stream[-100:]], [stream[:9], stream[9:]]):
        out, found = scan(True, pieces)
        assert out == b"\n\n".join([CHUNK] * 40 + [comment, DONE]) + b"\n\n"
        assert found.usage == Usage(prompt_tokens=40, cached_tokens=32, completion_tokens=2)
        assert found.ended
        assert found.reply() == "a" * 40
