"""Parse a client's body into a typed Request, refusing what no backend should see.

Only what the gateway itself relies on is checked here (JSON object, model, the prompt
field, stream flags, token limits); everything else is the backend's to judge, so its own
400s pass through unchanged.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.flow import Endpoint, Request

PROMPT_FIELD: dict[Endpoint, str] = {
    "chat": "messages",
    "completions": "prompt",
    "embeddings": "input",
}


def parse(body: bytes, endpoint: Endpoint, session_header: str | None = None) -> Request:
    data = _decode(body)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("you must provide a model parameter", param="model")
    field = PROMPT_FIELD[endpoint]
    if field not in data:
        raise InvalidRequest(f"Missing required parameter: '{field}'.", param=field)
    if endpoint == "chat" and not _valid_messages(data["messages"]):
        raise InvalidRequest(
            "'messages' must be a non-empty array of objects with a 'role'.", param="messages"
        )
    stream = data.get("stream") is True
    if "stream" in data and not isinstance(data["stream"], bool | None):
        raise InvalidRequest("'stream' must be a boolean.", param="stream")
    return Request(
        endpoint=endpoint,
        model=model,
        body=data,
        stream=stream,
        include_usage=_include_usage(data) and stream,
        max_tokens=_max_tokens(data),
        deterministic=data.get("temperature") == 0 and data.get("n", 1) == 1,
        session=session_header or _str_or_none(data.get("user")),
    )


def _decode(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return data


def _valid_messages(messages: Any) -> bool:
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    )


def _include_usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
    return options.get("include_usage") is True


def _max_tokens(data: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidRequest(f"'{name}' must be an integer.", param=name)
        if value < 1:
            raise InvalidRequest(f"'{name}' must be at least 1, got {value}.", param=name)
        return value
    return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
