"""Parse a client's body into a typed Request, refusing what no backend should see.

Only what the gateway itself relies on is checked here (JSON object, model, the prompt
field, chat messages' shape, nesting depth, stream flags, token limits); everything else is
the backend's to judge, so its own 400s pass through unchanged. The names the gateway
stores on the ledger row or keys on (model, user, safety_identifier, the session and
request id headers) are bounded and free of control characters: Postgres refuses a NUL in
any text column, so one such call would otherwise make its ledger row unwritable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.flow import Endpoint, Request
from gateway.stages import messages, responses
from gateway.stages.messages import CONTAINERS, MAX_DEPTH

PROMPT_FIELD: dict[Endpoint, str] = {
    "chat": "messages",
    "completions": "prompt",
    "embeddings": "input",
    "responses": "input",
}
MAX_TOKENS_FIELDS: dict[Endpoint, tuple[str, ...]] = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
    "embeddings": (),
    "responses": ("max_output_tokens",),
}
MAX_MODEL_CHARS = 200
"""The ledger's model column."""
MAX_SESSION_CHARS = 256
"""The `user` and `safety_identifier` fields and the x-session-id header."""
MAX_REQUEST_ID_CHARS = 128
"""The ledger's client_request_id column."""
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""C0 controls (NUL among them), DEL and C1 controls: nothing a name can hold."""


def parse(body: bytes, endpoint: Endpoint, session_header: str | None = None) -> Request:
    data = _decode(body)
    for name, value in data.items():  # messages: checked with their shape, below
        if type(value) in CONTAINERS and name != "messages":
            messages.check_depth(value, MAX_DEPTH - 1, name)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("you must provide a model parameter", param="model")
    _check_name(model, "model", MAX_MODEL_CHARS)
    if session_header is not None:
        _check_name(session_header, "x-session-id", MAX_SESSION_CHARS)
    field = PROMPT_FIELD[endpoint]
    if field not in data:
        raise InvalidRequest(f"Missing required parameter: '{field}'.", param=field)
    if endpoint == "chat":
        messages.check(data["messages"])
    elif endpoint == "responses":
        responses.check(data)
    stream = data.get("stream") is True and endpoint != "embeddings"  # embeddings never stream
    user = _user(data)
    if "stream" in data and not isinstance(data["stream"], bool | None):
        raise InvalidRequest("'stream' must be a boolean.", param="stream")
    return Request(
        endpoint=endpoint,
        model=model,
        body=data,
        stream=stream,
        # A Responses stream always ends with its usage (response.completed).
        include_usage=(_include_usage(data) or endpoint == "responses") and stream,
        max_tokens=_max_tokens(data, MAX_TOKENS_FIELDS[endpoint]),
        deterministic=data.get("temperature") == 0
        and data.get("n", 1) == 1
        and endpoint != "responses",  # each answer has its own response id
        session=session_header or _cache_key(data) or user,
        end_user=_safety_identifier(data) or user,
    )


def client_request_id(headers: Mapping[str, str]) -> str | None:
    """The client's x-request-id, if it sent one: at most 128 printable ASCII characters.

    It is echoed in a response header and kept on the ledger row, so it must be both."""
    value = headers.get("x-request-id")
    if not value:
        return None
    if len(value) > MAX_REQUEST_ID_CHARS or not (value.isascii() and value.isprintable()):
        raise InvalidRequest(
            f"The x-request-id header must be 1 to {MAX_REQUEST_ID_CHARS} printable ASCII "
            "characters.",
            param="x-request-id",
        )
    return value


def _check_name(value: str, name: str, limit: int) -> None:
    """Refuse a name too long for its column or holding control characters; the message
    never repeats the value."""
    if len(value) > limit:
        raise InvalidRequest(f"'{name}' must be at most {limit} characters.", param=name)
    if not value.isprintable() and _CONTROL.search(value):
        raise InvalidRequest(f"'{name}' must not contain control characters.", param=name)


def _cache_key(data: dict[str, Any]) -> str | None:
    """OpenAI's `prompt_cache_key`: the client names calls that share a prefix, so they
    are pinned together as a session is. Forwarded unchanged (vLLM accepts and ignores
    fields it does not know)."""
    key = data.get("prompt_cache_key")
    if key is not None and not isinstance(key, str):
        raise InvalidRequest("'prompt_cache_key' must be a string.", param="prompt_cache_key")
    if key:
        _check_name(key, "prompt_cache_key", MAX_SESSION_CHARS)
    return key or None


def _decode(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return data


def _include_usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
    return options.get("include_usage") is True


def _max_tokens(data: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidRequest(f"'{name}' must be an integer.", param=name)
        if value < 1:
            raise InvalidRequest(f"'{name}' must be at least 1, got {value}.", param=name)
        return value
    return None


def _safety_identifier(data: dict[str, Any]) -> str | None:
    """OpenAI's `safety_identifier` (the successor of `user`): who the app's end user is."""
    value = data.get("safety_identifier")
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest("'safety_identifier' must be a string.", param="safety_identifier")
    _check_name(value, "safety_identifier", MAX_SESSION_CHARS)
    return value or None


def _user(data: dict[str, Any]) -> str | None:
    user = data.get("user")
    if not isinstance(user, str) or not user:
        return None
    _check_name(user, "user", MAX_SESSION_CHARS)
    return user
