"""Chat messages of every kind the OpenAI API defines: accepted, or refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.flow import Endpoint
from gateway.stages.messages import MAX_DEPTH
from gateway.stages.parse import parse

GOOD: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
    {"role": "user", "content": "hi", "name": "ann"},
    {"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-1"}},
        {"type": "file", "file": {"file_data": "AAAA", "filename": "a.pdf"}},
        {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}},  # a backend's own
    ]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}], "refusal": "no"},
    {"role": "assistant", "content": "ok", "refusal": None, "tool_calls": [], "audio": None},
    {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
    {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    {"role": "tool", "content": [{"type": "text", "text": "42"}], "tool_call_id": "call_1"},
    {"role": "function", "name": "f", "content": None},
]  # fmt: skip


def chat(*messages: Any, **extra: Any) -> bytes:
    """Encoded with the standard library: orjson refuses the deepest bodies here."""
    return json.dumps({"model": "m", "messages": list(messages), **extra}).encode()


def test_every_kind_of_message_the_api_defines_is_accepted() -> None:
    assert parse(chat(*GOOD), "chat").body["messages"] == GOOD


BAD: list[tuple[Any, str]] = [
    ("hi", "messages[1]"),
    ({"content": "hi"}, "messages[1].role"),
    ({"role": 3, "content": "hi"}, "messages[1].role"),
    ({"role": {"$ne": 1}, "content": "hi"}, "messages[1].role"),
    ({"role": "user"}, "messages[1].content"),
    ({"role": "user", "content": None}, "messages[1].content"),
    ({"role": "user", "content": 5}, "messages[1].content"),
    ({"role": "user", "content": {"text": "hi"}}, "messages[1].content"),
    ({"role": "user", "content": ["hi"]}, "messages[1].content[0]"),
    ({"role": "user", "content": [{"text": "hi"}]}, "messages[1].content[0].type"),
    ({"role": "user", "content": [{"type": 1}]}, "messages[1].content[0].type"),
    ({"role": "user", "content": [{"type": "text", "text": 5}]}, "messages[1].content[0].text"),
    ({"role": "user", "content": [{"type": "text", "text": {"a": [1]}}]},
     "messages[1].content[0].text"),
    ({"role": "user", "content": [{"type": "text"}]}, "messages[1].content[0].text"),
    ({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": None}]},
     "messages[1].content[1].text"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": "http://x"}]},
     "messages[1].content[0].image_url"),
    ({"role": "user", "content": [{"type": "image_url"}]}, "messages[1].content[0].image_url"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": 1}}]},
     "messages[1].content[0].image_url.url"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u", "detail": 2}}]},
     "messages[1].content[0].image_url.detail"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "A"}}]},
     "messages[1].content[0].input_audio.format"),
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": [1]}]},
     "messages[1].content[0].input_audio"),
    ({"role": "user", "content": [{"type": "file", "file": {"file_data": 7}}]},
     "messages[1].content[0].file.file_data"),
    ({"role": "assistant", "content": [{"type": "refusal", "refusal": False}]},
     "messages[1].content[0].refusal"),
    ({"role": "user", "content": "hi", "name": {"a": 1}}, "messages[1].name"),
    ({"role": "assistant", "refusal": 1}, "messages[1].refusal"),
    ({"role": "assistant", "tool_calls": "junk"}, "messages[1].tool_calls"),
    ({"role": "assistant", "tool_calls": [1]}, "messages[1].tool_calls[0]"),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
     "messages[1].tool_calls[0].id"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "function": 5}]},
     "messages[1].tool_calls[0].function"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": 1, "arguments": ""}}]},
     "messages[1].tool_calls[0].function.name"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {}}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "assistant", "function_call": {"name": "f"}}, "messages[1].function_call.arguments"),
    ({"role": "tool", "content": "42"}, "messages[1].tool_call_id"),
    ({"role": "tool", "content": "42", "tool_call_id": 1}, "messages[1].tool_call_id"),
    ({"role": "function", "content": "42"}, "messages[1].name"),
]  # fmt: skip


@pytest.mark.parametrize(("message", "param"), BAD)
def test_a_malformed_message_is_refused_naming_its_field(message: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(chat({"role": "system", "content": "s"}, message), "chat")
    assert info.value.param == param
    assert param in info.value.message


def nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat({"role": "user", "content": "hi", "meta": nested(300)}), "messages[0].meta[0]"),
        (chat({"role": "user", "content": [{"type": "x", "x": nested(300)}]}),
         "messages[0].content[0]"),
        (chat({"role": "user", "content": "hi"}, tools=nested(MAX_DEPTH)), "tools[0][0]"),
        (json.dumps({"model": "m", "prompt": "p", "logit_bias": {"a": nested(200)}}).encode(),
         "logit_bias.a[0]"),
    ],
)  # fmt: skip
def test_a_body_nested_too_deeply_is_refused_naming_its_field(body: bytes, param: str) -> None:
    endpoint: Endpoint = "chat" if b"messages" in body else "completions"
    with pytest.raises(InvalidRequest) as info:
        parse(body, endpoint)
    assert info.value.param == param


def test_nesting_up_to_the_limit_is_accepted() -> None:
    body = chat({"role": "user", "content": "hi"}, tools=nested(MAX_DEPTH - 1))
    assert parse(body, "chat").body["tools"] == nested(MAX_DEPTH - 1)
