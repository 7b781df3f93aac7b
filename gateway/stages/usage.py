"""Token counts as the backend reported them.

OpenAI's convention, which vLLM follows: ``prompt_tokens`` includes the cached ones, and a
missing ``prompt_tokens_details`` (how vLLM reports a miss when details are off) means
zero cached tokens.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.flow import Usage

__all__ = ["Usage", "delivered_text", "from_body", "from_usage"]


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
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    message = choice.get("message") or choice.get("delta")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text if isinstance(text, str) else ""


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
        if isinstance(data, dict):
            parts.append(_choice_text(data))
    return "".join(parts)
