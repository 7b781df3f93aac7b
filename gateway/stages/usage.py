"""Token counts as the backend reported them.

OpenAI's convention, which vLLM follows: ``prompt_tokens`` includes the cached ones, and a
missing ``prompt_tokens_details`` (how vLLM reports a miss when details are off) means
zero cached tokens. The Responses API names them ``input_tokens`` (cached ones included,
``input_tokens_details.cached_tokens``) and ``output_tokens``; vLLM adds a
``cache_write_tokens`` there that counts prompt tokens it prefilled and kept, which are
billed as standard input like every uncached prompt token (not as a cache write).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.flow import Usage

__all__ = [
    "Usage",
    "delivered_text",
    "event_start",
    "event_usage",
    "from_body",
    "from_usage",
    "stream_text",
]


def from_usage(usage: Any) -> Usage | None:
    """A Usage from an OpenAI ``usage`` object, or None if it is not one."""
    if not isinstance(usage, dict):
        return None
    if "input_tokens" in usage:
        return _responses_usage(usage)
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, dict) else 0,
        cache_write_tokens=_int(details.get("cache_write_tokens"))
        if isinstance(details, dict)
        else 0,
    )


def _responses_usage(usage: dict[str, Any]) -> Usage:
    details = usage.get("input_tokens_details")
    return Usage(
        prompt_tokens=_int(usage.get("input_tokens")),
        completion_tokens=_int(usage.get("output_tokens")),
        cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, dict) else 0,
    )


def event_usage(data: Any) -> Usage | None:
    """The usage an SSE event's data carries: a chat or completions chunk's ``usage``, or
    the response of a Responses stream's last event (``response.completed``, ``.incomplete``
    or ``.failed``)."""
    if not isinstance(data, dict):
        return None
    response = data.get("response")
    if isinstance(response, dict) and "usage" in response:
        return from_usage(response["usage"])
    return from_usage(data.get("usage"))


def from_body(body: bytes) -> tuple[Usage | None, str]:
    """Usage and the first choice's text of a whole (non-streamed) JSON response."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, ""
    if not isinstance(data, dict):
        return None, ""
    return from_usage(data.get("usage")), _choice_text(data)


def _choice_text(data: dict[str, Any]) -> str:
    """The text of a chat or completions answer or chunk, or of a Responses answer or
    text delta event."""
    if data.get("object") == "response":
        return _output_text(data.get("output"))
    if data.get("type") == "response.output_text.delta":
        delta = data.get("delta")
        return delta if isinstance(delta, str) else ""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    message = choice.get("message") or choice.get("delta")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text if isinstance(text, str) else ""


def _output_text(output: Any) -> str:
    """The text parts of a Responses answer's message items, in order."""
    parts = []
    for item in output if isinstance(output, list) else ():
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") == "output_text":
                text = part.get("text")
                parts.append(text if isinstance(text, str) else "")
    return "".join(parts)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


VLLM_TEXT = re.compile(
    rb'"choices":\[\{"index":0,(?:"delta":\{(?:"role":"assistant",)?"content"|"text"):'
    rb'"([^"\\\x00-\x1f]*(?:\\.[^"\\\x00-\x1f]*)*)"[,}]'
)
"""The text of a chat or completions chunk whose first choice is choice 0, as vLLM writes
it: the body of a JSON string. Only the first choice can follow ``"choices":[{``, and a
JSON string holds no unescaped quote, newline or other control character, so a match lies
within one line and on valid JSON is exactly the string's body."""


def stream_text(events: bytes) -> str:
    """The generated text of complete SSE events (each ending in a blank line).

    Events shaped as vLLM writes them (one line each: chunks with text, then a usage
    chunk without choices and ``[DONE]``) are read in one pass and one decode instead of
    a JSON parse and a walk per token's event; on valid JSON both find the same text.
    Anything else (another server's field order, a second choice, a Responses stream, a
    comment, an invalid escape, bytes that are not UTF-8) is parsed event by event, which
    decides what the text is. Each scan of the events costs about a tenth of a
    microsecond per token's event, a fifth of what a Rust router spends on it in all, so
    the check that every event was read is one count of lines, not one per event kind."""
    found = VLLM_TEXT.findall(events)
    if 2 * (len(found) + _closing(events)) == events.count(b"\n"):  # all read, one line each
        body = b"".join(found)
        try:
            return str(orjson.loads(b'"' + body + b'"')) if b"\\" in body else body.decode()
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            pass
    return delivered_text(events.split(b"\n\n"))


def _closing(events: bytes) -> int:
    """How many of the last two events are the ones vLLM closes a stream with, which carry
    no text: the usage chunk (no choices) and ``[DONE]``."""
    closing, end = 0, len(events) - 2
    while closing < 2 and end > 0:
        start = event_start(events, end)
        event = events[start:end]
        if event != b"data: [DONE]" and (
            b'"choices":[]' not in event or VLLM_TEXT.search(event) is not None
        ):
            break
        closing, end = closing + 1, start - 2
    return closing


def event_start(events: bytes, end: int) -> int:
    """Where the event that ends at ``end`` (its blank line excluded) begins."""
    start = events.rfind(b"\n\n", 0, end)
    return start + 2 if start >= 0 else 0


def delivered_text(events: list[bytes]) -> str:
    """The generated text carried by SSE events (chat deltas or completion text), each
    parsed."""
    parts: list[str] = []
    for event in events:
        payload = event.partition(b"data:")[2].strip()
        if not payload.startswith(b"{"):
            continue
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if isinstance(data, dict):
            parts.append(_choice_text(data))
    return "".join(parts)
