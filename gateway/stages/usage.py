"""Token counts as the backend reported them.

OpenAI's convention, which vLLM follows: ``prompt_tokens`` includes the cached ones, and a
missing ``prompt_tokens_details`` (how vLLM reports a miss when details are off) means
zero cached tokens.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.flow import Usage

__all__ = ["Usage", "answer_text", "delivered_text", "from_body", "from_usage"]


def from_usage(usage: Any) -> Usage | None:
    """A Usage from an OpenAI ``usage`` object, or None if it is not one."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, dict) else 0,
        cache_write_tokens=_int(details.get("cache_write_tokens"))
        if isinstance(details, dict)
        else 0,
    )


def from_body(body: bytes) -> Usage | None:
    """Usage of a whole (non-streamed) JSON response."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return from_usage(data.get("usage")) if isinstance(data, dict) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def delivered_text(events: list[bytes]) -> str:
    """The generated text carried by SSE events (chat deltas or completion text)."""
    parts: list[str] = []
    for event in events:
        payload = event.partition(b"data:")[2].strip()
        if not payload.startswith(b"{"):
            continue
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        for choice in data.get("choices") or ():
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def answer_text(body: bytes) -> str:
    """The first choice's generated text of a whole (non-streamed) chat response."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    choices = data.get("choices") if isinstance(data, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""
