import json
from pathlib import Path

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.flow import Usage
from gateway.stages import usage
from gateway.stages.usage import delivered_text, from_body, from_usage


def test_cached_tokens_from_details() -> None:
    u = from_usage(
        {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 64},
        }
    )
    assert u == Usage(prompt_tokens=100, cached_tokens=64, completion_tokens=5)


def test_missing_or_null_details_mean_no_cached_tokens() -> None:
    assert from_usage({"prompt_tokens": 9, "completion_tokens": 1}) == Usage(9, 0, 1)
    assert from_usage({"prompt_tokens": 9, "prompt_tokens_details": None}) == Usage(9, 0, 0)


def test_not_a_usage_object() -> None:
    assert from_usage(None) is None
    assert from_body(b"not json") == (None, "")
    assert from_body(b'{"usage": null}') == (None, "")
    assert from_body(b'{"usage": {"prompt_tokens": 3}}') == (Usage(prompt_tokens=3), "")


def test_reply_text_of_chat_and_completion_bodies() -> None:
    chat = b'{"choices": [{"message": {"role": "assistant", "content": "hi there"}}]}'
    assert from_body(chat) == (None, "hi there")
    assert from_body(b'{"choices": [{"text": " once"}], "usage": {}}')[1] == " once"


def test_delivered_text_joins_stream_deltas() -> None:
    events = [
        b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}',
        b'data: {"choices": [{"delta": {"content": "a b"}}]}',
        b'data: {"choices": [{"text": " c"}]}',
        b"data: [DONE]",
    ]
    assert delivered_text(events) == "a b c"


def vllm_chunk(content: str, index: int = 0, role: bool = False) -> bytes:
    """A chat chunk as vLLM writes it (compact JSON, non-ASCII as UTF-8)."""
    delta = {"role": "assistant", "content": content} if role else {"content": content}
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
    body = {"id": "chatcmpl-9a", "object": "chat.completion.chunk", "created": 1795964375,
            "model": "tiny", "choices": [choice]}  # fmt: skip
    return b"data: " + orjson.dumps(body)


def stream(events: list[bytes]) -> bytes:
    """Events as the relay delivers them: each ends in a blank line."""
    return b"".join(e + b"\n\n" for e in events)


@given(st.lists(st.text(), min_size=1, max_size=5))
def test_vllm_chunks_read_at_once_give_what_the_parse_gives(texts: list[str]) -> None:
    """Quotes, backslashes, control characters, astral code points, the role chunk:
    the text read from vLLM's chunks in one pass is the text a JSON parse finds."""
    events = [vllm_chunk(t, role=i == 0) for i, t in enumerate(texts)]
    assert usage.stream_text(stream([*events, b"data: [DONE]"])) == "".join(texts)
    assert delivered_text(events) == "".join(texts)


def completion_chunk(text: str, model: str) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    body = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": model,
            "choices": [choice]}  # fmt: skip
    return b"data: " + orjson.dumps(body)


def usage_chunk(model: str) -> bytes:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}  # fmt: skip
    return b"data: " + orjson.dumps(body)


EVENTS = st.one_of(
    st.text().map(vllm_chunk),
    st.text().map(lambda t: vllm_chunk(t, role=True)),
    st.text().map(lambda t: vllm_chunk(t, index=1)),
    st.tuples(st.text(), st.text()).map(lambda a: completion_chunk(*a)),
    st.text().map(usage_chunk),
    st.sampled_from([b"data: [DONE]", b": ping", b"data: {}", b"event: x", b"data: []"]),
    st.binary(max_size=40).filter(lambda b: b"\n\n" not in b and not b.endswith(b"\n")),
)


@given(st.lists(EVENTS, max_size=6))
def test_the_one_pass_read_gives_what_parsing_each_event_gives(events: list[bytes]) -> None:
    """Whatever valid JSON the events carry (any text or model name, other choices, usage
    chunks, completions), and whatever else comes between them (comments, bytes that are
    not JSON or not UTF-8), reading them at once and parsing them one by one find the
    same text."""
    assert usage.stream_text(stream(events)) == delivered_text(events)


def test_chunks_of_another_shape_or_choice_are_parsed() -> None:
    """A second choice's chunk, reordered fields, an escape that is not JSON, a chunk cut
    short: the parse decides (the first choice of each chunk; what is not JSON, skipped)."""
    second = vllm_chunk("two", index=1)
    reordered = b'data: {"object":"chat.completion.chunk","id":"x","created":1,"model":"m",' \
                b'"choices":[{"index":0,"delta":{"content":"three"}}]}'  # fmt: skip
    broken = vllm_chunk("x").replace(b'"content":"x"', b'"content":"\\q"')
    four = vllm_chunk("four")
    cut = four[: four.index(b"four") + 2]  # "content":"fo, no closing quote
    events = [vllm_chunk("one"), second, reordered, broken, cut]
    assert usage.stream_text(stream(events)) == "onetwothree"
    assert usage.stream_text(stream([vllm_chunk("one"), broken])) == "one"
    assert usage.stream_text(stream([vllm_chunk("one"), cut])) == "one"


FIXTURES = Path(__file__).parents[2] / "vllm" / "fixtures"


def test_a_responses_answer_recorded_from_vllm_gives_its_usage_and_text() -> None:
    body = json.loads((FIXTURES / "responses.json").read_text())["body"]
    found, text = usage.from_body(json.dumps(body).encode())
    reported = body["usage"]
    assert found == Usage(
        prompt_tokens=reported["input_tokens"],
        completion_tokens=reported["output_tokens"],
        cached_tokens=reported["input_tokens_details"]["cached_tokens"],
    )  # vLLM's cache_write_tokens are standard input here, not cache writes
    assert text == body["output"][0]["content"][0]["text"]


def test_a_responses_stream_recorded_from_vllm_gives_its_usage_and_text() -> None:
    recorded = json.loads((FIXTURES / "responses_stream.json").read_text())
    events = recorded["raw"].encode().split(b"\n\n")[:-1]
    found = [usage.event_usage(e) for e in recorded["events"]]
    completed = recorded["events"][-1]["response"]
    assert found[:-1] == [None] * (len(found) - 1)  # created, in_progress: usage null
    assert found[-1] == usage.from_usage(completed["usage"])
    assert found[-1] is not None
    assert found[-1].completion_tokens == 12
    assert usage.delivered_text(events) == completed["output"][0]["content"][0]["text"]
