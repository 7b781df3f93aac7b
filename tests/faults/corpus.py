"""A hostile corpus: requests written to break the gateway, each with what it must answer.

Every entry goes over a real socket, byte for byte as written here. Each must be answered
with OpenAI-shaped JSON and a status below 500; where the gateway itself judges the request
the entry names the status, and the field (``param``) the error must name. Entries without
a status are the backend's to judge (or to serve).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.e2e.conftest import MODEL
from tests.faults.rawhttp import Headers

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
JSON_TYPE: Headers = ((b"content-type", b"application/json"),)


@dataclass(frozen=True)
class Hostile:
    name: str
    body: bytes
    path: str = CHAT
    headers: Headers = JSON_TYPE
    status: int | None = None
    """The status the gateway itself must answer; None: anything below 500."""
    param: str | None = None
    """The field a 400 must name."""
    authorized: bool = True
    """Send the corpus's API key (entries about Authorization send their own)."""
    content_length: bool = True
    """Declare the body's true length (entries about Content-Length declare their own)."""


def encode(value: Any) -> bytes:
    """The standard library's encoder: it writes what orjson refuses (deep nesting, NaN)."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def chat(*messages: Any, **fields: Any) -> bytes:
    msgs = list(messages) or [{"role": "user", "content": "hi"}]
    return encode({"model": MODEL, "messages": msgs, "max_tokens": 4, **fields})


def user(content: Any, **fields: Any) -> bytes:
    return chat({"role": "user", "content": content, **fields})


def nested(levels: int, leaf: Any = "x") -> Any:
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"a": value}
    return value


def bad(name: str, body: bytes, param: str | None, path: str = CHAT) -> Hostile:
    """A request the gateway must refuse itself: 400 naming `param`."""
    return Hostile(name, body, path, status=400, param=param)


MALFORMED_JSON = [
    bad("empty body", b"", None),
    bad("open brace", b"{", None),
    bad("truncated", b'{"model": "' + MODEL.encode() + b'", "messages": [', None),
    bad("trailing garbage", chat() + b"}}", None),
    bad("single quotes", b"{'model': 'sim-model'}", None),
    bad("comments", b'{"model": "sim-model" /* hi */}', None),
    bad("NaN literal", b'{"model": "sim-model", "prompt": "x", "temperature": NaN}', None,
        COMPLETIONS),
    bad("infinite number", b'{"model": "sim-model", "prompt": "x", "temperature": 1e400}', None,
        COMPLETIONS),
    bad("array body", b"[]", None),
    bad("null body", b"null", None),
    bad("string body", b'"hello"', None),
    bad("number body", b"42", None),
    bad("BOM before JSON", b"\xef\xbb\xbf" + chat(), None),
    bad("UTF-16 body", chat().decode().encode("utf-16"), None),
    bad("form body", b"model=sim-model&prompt=x", None, COMPLETIONS),
    bad("deep array, 100k levels", b"[" * 100_000 + b"]" * 100_000, None),
]  # fmt: skip

INVALID_UTF8 = [
    bad("invalid byte in content", b'{"model":"sim-model","messages":[{"role":"user","content":"\xff"}]}',
        None),
    bad("overlong encoding", b'{"model":"sim-model","messages":[{"role":"user","content":"\xc0\xaf"}]}',
        None),
    bad("truncated multibyte", b'{"model":"sim-model","messages":[{"role":"user","content":"\xe2\x82"}]}',
        None),
    bad("lone surrogate escape", b'{"model":"sim-model","messages":[{"role":"user","content":"\\ud800"}]}',
        None),
    bad("invalid byte in model", b'{"model":"sim\xfe","prompt":"x"}', None, COMPLETIONS),
    bad("latin-1 body", '{"model":"sim-model","prompt":"caf\u00e9"}'.encode("latin-1"), None,
        COMPLETIONS),
]  # fmt: skip

CONTENT_TYPES = [
    Hostile("text/plain content type", chat(), headers=((b"content-type", b"text/plain"),)),
    Hostile("no content type", chat(), headers=()),
    Hostile("multipart content type", chat(),
            headers=((b"content-type", b"multipart/form-data; boundary=x"),)),
    Hostile("json with a latin-1 charset", chat(),
            headers=((b"content-type", b"application/json; charset=latin-1"),)),
    Hostile("content type of 4 KB", chat(), headers=((b"content-type", b"a" * 4096),)),
]  # fmt: skip

MODEL_FIELD = [
    bad("no model", encode({"messages": [{"role": "user", "content": "hi"}]}), "model"),
    bad("model null", encode({"model": None, "prompt": "x"}), "model", COMPLETIONS),
    bad("model number", encode({"model": 7, "prompt": "x"}), "model", COMPLETIONS),
    bad("model array", encode({"model": [MODEL], "prompt": "x"}), "model", COMPLETIONS),
    bad("model object", encode({"model": {"name": MODEL}, "prompt": "x"}), "model", COMPLETIONS),
    bad("model empty", encode({"model": "", "prompt": "x"}), "model", COMPLETIONS),
    Hostile("model with NUL", encode({"model": MODEL + "\x00", "prompt": "x"}), COMPLETIONS),
    Hostile("model of 100 KB", encode({"model": "m" * 100_000, "prompt": "x"}), COMPLETIONS),
    Hostile("model with control characters", encode({"model": "\x1b[31msim\x07", "prompt": "x"}),
            COMPLETIONS),
    Hostile("model with bidi override", encode({"model": "\u202esim-model", "prompt": "x"}),
            COMPLETIONS),
    Hostile("model with trailing space", encode({"model": MODEL + " ", "prompt": "x"}),
            COMPLETIONS),
]  # fmt: skip

MESSAGES = [
    bad("messages missing", encode({"model": MODEL}), "messages"),
    bad("messages null", encode({"model": MODEL, "messages": None}), "messages"),
    bad("messages string", encode({"model": MODEL, "messages": "hi"}), "messages"),
    bad("messages object", encode({"model": MODEL, "messages": {"role": "user"}}), "messages"),
    bad("messages empty", encode({"model": MODEL, "messages": []}), "messages"),
    bad("message a string", chat("hi"), "messages[0]"),
    bad("message null", chat(None), "messages[0]"),
    bad("message without role", chat({"content": "hi"}), "messages[0].role"),
    bad("role a number", chat({"role": 1, "content": "hi"}), "messages[0].role"),
    bad("role an object", chat({"role": {"$ne": 1}, "content": "hi"}), "messages[0].role"),
    bad("user without content", chat({"role": "user"}), "messages[0].content"),
    bad("content a number", user(5), "messages[0].content"),
    bad("content an object", user({"text": "hi"}), "messages[0].content"),
    bad("content true", user(True), "messages[0].content"),
    bad("content parts of strings", user(["hi"]), "messages[0].content[0]"),
    bad("part without type", user([{"text": "hi"}]), "messages[0].content[0].type"),
    bad("part type a number", user([{"type": 3, "text": "hi"}]), "messages[0].content[0].type"),
    bad("text a number", user([{"type": "text", "text": 5}]), "messages[0].content[0].text"),
    bad("text an object", user([{"type": "text", "text": {"a": [1]}}]),
        "messages[0].content[0].text"),
    bad("text an array", user([{"type": "text", "text": ["a"]}]), "messages[0].content[0].text"),
    bad("text missing", user([{"type": "text"}]), "messages[0].content[0].text"),
    bad("second part's text null", user([{"type": "text", "text": "a"}, {"type": "text", "text": None}]),
        "messages[0].content[1].text"),
    bad("image_url a string", user([{"type": "image_url", "image_url": "http://x/a.png"}]),
        "messages[0].content[0].image_url"),
    bad("image_url without url", user([{"type": "image_url", "image_url": {}}]),
        "messages[0].content[0].image_url.url"),
    bad("image url a number", user([{"type": "image_url", "image_url": {"url": 1}}]),
        "messages[0].content[0].image_url.url"),
    bad("image detail an array", user([{"type": "image_url", "image_url": {"url": "u", "detail": []}}]),
        "messages[0].content[0].image_url.detail"),
    bad("input_audio without format", user([{"type": "input_audio", "input_audio": {"data": "AA"}}]),
        "messages[0].content[0].input_audio.format"),
    bad("input_audio data a number", user([{"type": "input_audio", "input_audio": {"data": 1, "format": "wav"}}]),
        "messages[0].content[0].input_audio.data"),
    bad("file an array", user([{"type": "file", "file": [1]}]), "messages[0].content[0].file"),
    bad("file_data an object", user([{"type": "file", "file": {"file_data": {}}}]),
        "messages[0].content[0].file.file_data"),
    bad("refusal part not a string", chat({"role": "assistant", "content": [{"type": "refusal", "refusal": 0}]}),
        "messages[0].content[0].refusal"),
    bad("name an object", user("hi", name={"first": "a"}), "messages[0].name"),
    bad("tool_calls a string", chat({"role": "assistant", "tool_calls": "junk"}),
        "messages[0].tool_calls"),
    bad("tool call a number", chat({"role": "assistant", "tool_calls": [1]}),
        "messages[0].tool_calls[0]"),
    bad("tool call without id", chat({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": ""}}]}),
        "messages[0].tool_calls[0].id"),
    bad("tool call function a number", chat({"role": "assistant", "tool_calls": [{"id": "c", "function": 5}]}),
        "messages[0].tool_calls[0].function"),
    bad("tool call arguments an object", chat({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}),
        "messages[0].tool_calls[0].function.arguments"),
    bad("tool call name null", chat({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": None, "arguments": "{}"}}]}),
        "messages[0].tool_calls[0].function.name"),
    bad("function_call junk", chat({"role": "assistant", "function_call": "f()"}),
        "messages[0].function_call"),
    bad("tool message without tool_call_id", chat({"role": "tool", "content": "42"}),
        "messages[0].tool_call_id"),
    bad("tool_call_id an array", chat({"role": "tool", "content": "42", "tool_call_id": ["c"]}),
        "messages[0].tool_call_id"),
    bad("function message without name", chat({"role": "function", "content": "42"}),
        "messages[0].name"),
    bad("deeply nested field in a message", user("hi", metadata=nested(300)),
        "messages[0].metadata[0]"),
    bad("deeply nested unknown part", user([{"type": "x-embeds", "data": nested(300)}]),
        "messages[0].content[0]"),
    bad("deeply nested tool call", chat({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}, "extra": nested(300)}]}),
        "messages[0].tool_calls[0]"),
    bad("fourth message bad among good", chat(
        {"role": "system", "content": "s"}, {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"}, {"role": "user", "content": [{"type": "text", "text": 1}]}),
        "messages[3].content[0].text"),
    Hostile("unknown role", chat({"role": "hacker", "content": "hi"})),
    Hostile("NUL in content", user("a\x00b")),
    Hostile("control characters in content", user("".join(chr(c) for c in range(32)))),
    Hostile("unicode edge cases in content", user("\u202e\ufeff\u200b\U0010ffff\U0001f600e\u0301")),
    Hostile("1 MB content", user("lorem ipsum " * 90_000)),
    Hostile("2,000 messages", chat(*[{"role": "user", "content": "hi"}] * 2000)),
    Hostile("unknown part type", user([{"type": "x-video", "x-video": {"url": "u"}}])),
]  # fmt: skip

NUMBERS = [
    bad("max_tokens zero", chat(max_tokens=0), "max_tokens"),
    bad("max_tokens negative", chat(max_tokens=-1), "max_tokens"),
    bad("max_tokens a string", chat(max_tokens="10"), "max_tokens"),
    bad("max_tokens true", chat(max_tokens=True), "max_tokens"),
    bad("max_tokens a fraction", chat(max_tokens=1.5), "max_tokens"),
    bad("max_tokens 1e30", chat(max_tokens=1e30), "max_tokens"),
    bad("max_completion_tokens an object", chat(max_completion_tokens={}), "max_completion_tokens"),
    Hostile("max_tokens 2**63-1", chat(max_tokens=2**63 - 1)),
    Hostile("max_tokens 2**64", chat(max_tokens=2**64)),
    Hostile("max_tokens 10**40", chat(max_tokens=10**40)),
    Hostile("n zero", chat(n=0)),
    Hostile("n negative", chat(n=-5)),
    Hostile("n a million", chat(n=1_000_000)),
    Hostile("n 2**70", chat(n=2**70)),
    Hostile("temperature a string", chat(temperature="hot")),
    Hostile("temperature 1e308", chat(temperature=1e308)),
    Hostile("temperature -0", chat(temperature=-0.0)),
    Hostile("logit_bias junk", chat(logit_bias={"x": "y"})),
    Hostile("seed 2**80", chat(seed=2**80)),
    bad("stream a string", chat(stream="true"), "stream"),
    bad("stream a number", chat(stream=1), "stream"),
    bad("stream_options a list", chat(stream=True, stream_options=[True]), "stream_options"),
    Hostile("include_usage a string", chat(stream_options={"include_usage": "yes"})),
    Hostile("tools a string", chat(tools="all")),
    Hostile("tools junk", chat(tools=[1, None, {"type": 5}])),
    bad("tools nested 300 levels", chat(tools=[nested(300)]), "tools[0][0]"),
    Hostile("response_format junk", chat(response_format="json")),
    bad("unknown field nested 300 levels", chat(x_extra=nested(300)), "x_extra[0].a"),
]  # fmt: skip

USER_FIELD = [
    Hostile("user with NUL", chat(user="a\x00b")),
    Hostile("user a number", chat(user=12)),
    Hostile("user an object", chat(user={"id": 1})),
    Hostile("user of 100 KB", chat(user="u" * 100_000)),
]

PROMPTS = [
    bad("prompt missing", encode({"model": MODEL}), "prompt", COMPLETIONS),
    Hostile("prompt an object", encode({"model": MODEL, "prompt": {"a": 1}}), COMPLETIONS),
    Hostile("prompt null", encode({"model": MODEL, "prompt": None}), COMPLETIONS),
    Hostile("prompt a list of lists", encode({"model": MODEL, "prompt": [[1, 2], [3]]}), COMPLETIONS),
    Hostile("prompt token ids out of range", encode({"model": MODEL, "prompt": [-1, 2**40]}),
            COMPLETIONS),
    Hostile("prompt of 20k token ids", encode({"model": MODEL, "prompt": list(range(20_000))}),
            COMPLETIONS),
    Hostile("prompt mixed types", encode({"model": MODEL, "prompt": ["a", 1, None]}), COMPLETIONS),
    bad("prompt nested 300 levels", encode({"model": MODEL, "prompt": nested(300)}), "prompt[0].a",
        COMPLETIONS),
    Hostile("prompt empty", encode({"model": MODEL, "prompt": ""}), COMPLETIONS),
    bad("input missing", encode({"model": MODEL}), "input", EMBEDDINGS),
    Hostile("input an object", encode({"model": MODEL, "input": {"a": 1}}), EMBEDDINGS),
    Hostile("input of nulls", encode({"model": MODEL, "input": [None, None]}), EMBEDDINGS),
    Hostile("input of empty lists", encode({"model": MODEL, "input": [[], []]}), EMBEDDINGS),
    Hostile("input of 300 strings", encode({"model": MODEL, "input": ["a"] * 300}), EMBEDDINGS),
    bad("input nested 300 levels", encode({"model": MODEL, "input": nested(300)}), "input[0].a",
        EMBEDDINGS),
    Hostile("encoding_format junk", encode({"model": MODEL, "input": "a", "encoding_format": 5}),
            EMBEDDINGS),
    Hostile("dimensions negative", encode({"model": MODEL, "input": "a", "dimensions": -1}),
            EMBEDDINGS),
]  # fmt: skip

HEADERS = [
    Hostile("x-request-id of 300 bytes", chat(), headers=((b"x-request-id", b"r" * 300),)),
    Hostile("x-request-id of 8 KB", chat(), headers=((b"x-request-id", b"r" * 8192),)),
    Hostile("x-request-id latin-1 bytes", chat(), headers=((b"x-request-id", b"\xe9\xff\xfe"),)),
    Hostile("x-request-id twice", chat(),
            headers=((b"x-request-id", b"a"), (b"x-request-id", b"b"))),
    Hostile("x-request-id empty", chat(), headers=((b"x-request-id", b""),)),
    Hostile("x-session-id of 8 KB", chat(), headers=((b"x-session-id", b"s" * 8192),)),
    Hostile("200 extra headers", chat(),
            headers=tuple((f"x-h{i}".encode(), b"v") for i in range(200))),
    Hostile("no authorization", chat(), authorized=False, status=401),
    Hostile("authorization without bearer", chat(), authorized=False, status=401,
            headers=((b"authorization", b"gk-nothing"),)),
    Hostile("authorization of 8 KB", chat(), authorized=False, status=401,
            headers=((b"authorization", b"Bearer " + b"k" * 8192),)),
    Hostile("authorization latin-1 bytes", chat(), authorized=False, status=401,
            headers=((b"authorization", b"Bearer \xff\xfe"),)),
]  # fmt: skip

MAX_BODY = 2 * 1024 * 1024
"""The corpus's gateway refuses bodies larger than this (server.max_body_bytes)."""

OVERSIZED = [
    Hostile("body over the limit", user("x" * (MAX_BODY + 1)), status=413),
    Hostile("declared length over the limit", chat(), content_length=False, status=413,
            headers=((b"content-length", b"1000000000000"),)),
    Hostile("chunked body over the limit", b"%x\r\n" % (MAX_BODY + 10) + b"x" * (MAX_BODY + 10)
            + b"\r\n0\r\n\r\n", content_length=False, status=413,
            headers=((b"transfer-encoding", b"chunked"),)),
    Hostile("chunked body", b"%x\r\n" % len(chat()) + chat() + b"\r\n0\r\n\r\n",
            content_length=False, headers=((b"transfer-encoding", b"chunked"),)),
]  # fmt: skip

CORPUS: list[Hostile] = [
    *MALFORMED_JSON, *INVALID_UTF8, *CONTENT_TYPES, *MODEL_FIELD, *MESSAGES, *NUMBERS,
    *USER_FIELD, *PROMPTS, *HEADERS, *OVERSIZED,
]  # fmt: skip

REFUSED_BY_HTTP: list[tuple[str, Headers]] = [
    ("NUL in x-request-id", ((b"x-request-id", b"a\x00b"),)),
    ("control character in x-request-id", ((b"x-request-id", b"a\x01b"),)),
    ("NUL in authorization", ((b"authorization", b"Bearer \x00"),)),
    ("DEL in x-session-id", ((b"x-session-id", b"\x7f"),)),
    ("newline folded into a header", ((b"x-request-id", b"a\r\n b"),)),
]
"""Header values the HTTP server itself refuses (RFC 9110 forbids NUL and control
characters in them): 400 before any application code runs, so there is no call to meter."""
