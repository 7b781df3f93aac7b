import json
from pathlib import Path

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
