from gateway.flow import Usage
from gateway.stages.usage import answer_text, from_body, from_usage


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
    assert from_body(b"not json") is None
    assert from_body(b'{"usage": null}') is None
    assert from_body(b'{"usage": {"prompt_tokens": 3}}') == Usage(prompt_tokens=3)


def test_answer_text_of_a_whole_chat_response() -> None:
    body = b'{"choices": [{"message": {"role": "assistant", "content": "Hi there"}}]}'
    assert answer_text(body) == "Hi there"
    assert answer_text(b'{"choices": []}') == ""
    assert answer_text(b'{"choices": [{"message": {"content": null}}]}') == ""
    assert answer_text(b"not json") == ""
