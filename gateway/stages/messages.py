"""Chat messages as the OpenAI API defines them: a wrong one is refused naming its field.

Every later stage reads messages (the prefix stage renders their text, the ledger counts
their tokens), so a message of the wrong shape must stop at parse with a 400 that says
where it is wrong (``messages[2].content[0].text``), not fail deeper in with a 500. The
check covers what the API defines: content as a string or an array of parts (text,
image_url, input_audio, file, refusal), names, assistant tool calls and function calls,
tool and function results. Part types and roles it does not know (a backend's own
extensions) pass to the backend, which judges them.

The common message, a known role with a string content and nothing else, costs one
comparison of its shape; only other messages are checked field by field, and for depth.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.errors import InvalidRequest

MAX_DEPTH = 100
"""Deepest nesting of arrays and objects accepted in a body. Later stages encode parts of
it again (prefix hashing, coalescing, the upstream body) and orjson refuses more than 254
levels; 100 leaves room for any real JSON schema in tools or response_format."""

MESSAGE_DEPTH = MAX_DEPTH - 2
"""Levels left inside a message (the body, then the messages array, hold it)."""

CONTAINERS = (dict, list)

PLAIN_ROLES = frozenset({"system", "developer", "user", "assistant"})
"""Roles whose message may be only a role and a string content."""

CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})
"""Roles whose content may not be absent or null (an assistant turn may be all tool calls)."""

PART_FIELDS: dict[str, tuple[str, dict[str, bool]]] = {
    "image_url": ("image_url", {"url": True, "detail": False}),
    "input_audio": ("input_audio", {"data": True, "format": True}),
    "file": ("file", {"file_data": False, "file_id": False, "filename": False}),
}
"""Part type -> (the object field it carries, its string fields: required or not)."""

TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
              int: "an integer", float: "a number", type(None): "null"}  # fmt: skip


def check(messages: Any) -> None:
    """Raise InvalidRequest naming the first field of `messages` that has the wrong shape."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            "'messages' must be a non-empty array of message objects.", param="messages"
        )
    for i, message in enumerate(messages):
        if type(message) is dict and len(message) == 2 and type(message.get("content")) is str:
            role = message.get("role")
            if type(role) is str and role in PLAIN_ROLES:
                continue
        check_message(message, f"messages[{i}]")


def check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise wrong_type(where, message, "an object")
    required_string(message, "role", where)
    role = message["role"]
    content = message.get("content")
    if content is None:
        if role in CONTENT_REQUIRED:
            raise missing(f"{where}.content")
    elif isinstance(content, list):
        for j, part in enumerate(content):
            check_part(part, f"{where}.content[{j}]")
    elif not isinstance(content, str):
        raise wrong_type(f"{where}.content", content, "a string or an array of content parts")
    optional_string(message, "name", where)
    if role == "assistant":
        optional_string(message, "refusal", where)
        check_tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
        if message.get("function_call") is not None:
            check_function(message["function_call"], f"{where}.function_call")
    elif role == "tool":
        required_string(message, "tool_call_id", where)
    elif role == "function":
        required_string(message, "name", where)
    check_depth(message, MESSAGE_DEPTH, where)


def check_part(part: Any, where: str) -> None:
    """One content part: its type, and the fields the API defines for that type."""
    if not isinstance(part, dict):
        raise wrong_type(where, part, "a content part object")
    required_string(part, "type", where)
    kind = part["type"]
    if kind in ("text", "refusal"):
        required_string(part, kind, where)
    elif kind in PART_FIELDS:
        name, fields = PART_FIELDS[kind]
        inner = required_object(part.get(name), f"{where}.{name}")
        for field, required in fields.items():
            if required:
                required_string(inner, field, f"{where}.{name}")
            else:
                optional_string(inner, field, f"{where}.{name}")


def check_tool_calls(calls: Any, where: str) -> None:
    if calls is None:
        return
    if not isinstance(calls, list):
        raise wrong_type(where, calls, "an array")
    for k, call in enumerate(calls):
        place = f"{where}[{k}]"
        if not isinstance(call, dict):
            raise wrong_type(place, call, "an object")
        required_string(call, "id", place)
        optional_string(call, "type", place)
        check_function(call.get("function"), f"{place}.function")


def check_function(function: Any, where: str) -> None:
    """A function call: its name and its arguments, which the API defines as a JSON string."""
    fields = required_object(function, where)
    required_string(fields, "name", where)
    required_string(fields, "arguments", where)


def required_string(obj: dict[str, Any], field: str, where: str) -> None:
    value = obj.get(field)
    if not isinstance(value, str):
        place = f"{where}.{field}"
        raise missing(place) if value is None else wrong_type(place, value)


def required_object(value: Any, where: str) -> dict[str, Any]:
    """`value` itself, refused unless it is an object."""
    if not isinstance(value, dict):
        raise missing(where) if value is None else wrong_type(where, value, "an object")
    return value


def optional_string(obj: dict[str, Any], field: str, where: str) -> None:
    value = obj.get(field)
    if value is not None and not isinstance(value, str):
        raise wrong_type(f"{where}.{field}", value)


def wrong_type(param: str, value: Any, expected: str = "a string") -> InvalidRequest:
    got = TYPE_NAMES.get(type(value), "another type")
    return InvalidRequest(
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param=param
    )


def missing(param: str) -> InvalidRequest:
    return InvalidRequest(f"Missing required parameter: '{param}'.", param=param)


def check_depth(value: dict[str, Any] | list[Any], levels: int, where: str) -> None:
    """Refuse arrays and objects nested more than `levels` deep inside `value`."""
    path = too_deep(value, levels)
    if path is not None:
        param = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[:2])
        raise InvalidRequest(
            f"'{param}' is nested too deeply (more than {MAX_DEPTH} levels of arrays and objects).",
            param=param,
        )


def too_deep(value: dict[str, Any] | list[Any], levels: int) -> list[str | int] | None:
    """The path to an array or object nested more than `levels` deep, or None."""
    if levels == 0:
        return []
    children: Iterable[tuple[str | int, Any]]
    if isinstance(value, list):
        if not {list, dict}.intersection(map(type, value)):  # a list of scalars (token ids)
            return None
        children = enumerate(value)
    else:
        children = value.items()
    for key, child in children:
        if type(child) in CONTAINERS:
            path = too_deep(child, levels - 1)
            if path is not None:
                return [key, *path]
    return None
