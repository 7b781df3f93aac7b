from gateway.flow import Usage
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
