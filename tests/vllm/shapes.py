"""Compare two OpenAI-style answers by shape: keys, JSON types, stream framing, errors.

Values such as ids, times, text and token counts differ between any two servers; what a
client parses must not. Each function returns the differences as readable lines
(empty when the answers agree), so a failing test lists them all at once.
"""

from __future__ import annotations

import json
import re
from typing import Any

JSON_TYPES = {bool: "bool", int: "int", float: "float", str: "str", type(None): "null"}


def json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return JSON_TYPES[type(value)]


def shape_diff(want: Any, got: Any, path: str = "$") -> list[str]:
    """Keys and types of got that differ from want, recursively."""
    if json_type(want) != json_type(got):
        return [f"{path}: {json_type(want)} in vLLM, {json_type(got)} here"]
    if isinstance(want, dict):
        out = [f"{path}.{k}: missing" for k in want if k not in got]
        out += [f"{path}.{k}: extra" for k in got if k not in want]
        for k in want.keys() & got.keys():
            out += shape_diff(want[k], got[k], f"{path}.{k}")
        return out
    if isinstance(want, list):
        if len(want) != len(got):
            return [f"{path}: {len(want)} items in vLLM, {len(got)} here"]
        return [d for i, (w, g) in enumerate(zip(want, got, strict=True))
                for d in shape_diff(w, g, f"{path}[{i}]")]  # fmt: skip
    return []


def shape(value: Any) -> Any:
    """The value with every leaf replaced by its JSON type name."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return json_type(value)


def collapse(events: list[Any]) -> list[Any]:
    """One event per run of same-shaped events.

    vLLM sends one chunk per engine step, and several tokens share a chunk when the
    engine runs ahead of the HTTP writer, so the number of content chunks varies from run
    to run; their shape and order do not.
    """
    out: list[Any] = []
    for event in events:
        if not out or shape(out[-1]) != shape(event):
            out.append(event)
    return out


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip()


def error_diff(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Error bodies: type, param and code exactly; the message up to its numbers."""
    w, g = want.get("error"), got.get("error")
    if not isinstance(w, dict) or not isinstance(g, dict):
        return []
    out = [
        f"error.{k}: {w.get(k)!r} in vLLM, {g.get(k)!r} here"
        for k in ("type", "param", "code")
        if w.get(k) != g.get(k)
    ]
    if _digits(w.get("message")) != _digits(g.get("message")):
        out.append(f"error.message: {w.get('message')!r} in vLLM, {g.get('message')!r} here")
    return out


def _digits(message: Any) -> str:
    """Numbers depend on the tokenizer, the wording does not."""
    return re.sub(r"\d+", "N", str(message))


def framing_diff(want: str, got: str) -> list[str]:
    """SSE as vLLM frames it: blank-line separated events, each one `data: <json>` line
    ending with `data: [DONE]` (chat, completions), or, in the Responses API, an
    `event: <type>` line before each `data: ` line naming the same type, and no [DONE]."""
    blocks = got.split("\n\n")
    out = []
    if blocks[-1] != "":
        out.append("stream does not end with a blank line")
    events = blocks[:-1]
    typed = want.startswith("event: ")
    if typed:
        out += [f"event {i} is not `event: <type>` and its data: {e[:80]!r}"
                for i, e in enumerate(events) if not _typed_event(e)]  # fmt: skip
        if events and events[-1] == "data: [DONE]":
            out.append("a Responses stream ends with `data: [DONE]`")
        return out
    if not events or events[-1] != "data: [DONE]":
        out.append("stream does not end with `data: [DONE]`")
    out += [f"event {i} is not one `data: ` line: {e[:80]!r}"
            for i, e in enumerate(events) if not e.startswith("data: ") or "\n" in e]  # fmt: skip
    return out


def _typed_event(block: str) -> bool:
    lines = block.split("\n")
    if len(lines) != 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
        return False
    kind = lines[0].removeprefix("event: ")
    return bool(json.loads(lines[1].removeprefix("data: ")).get("type") == kind)


def answer_diff(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Two recorded answers (see tests.vllm.capture): status, media type, body or stream."""
    out = []
    if want["status"] != got["status"]:
        out.append(f"status: {want['status']} in vLLM, {got['status']} here")
    if media_type(want["content_type"]) != media_type(got["content_type"]):
        out.append(f"content-type: {want['content_type']} in vLLM, {got['content_type']} here")
    if "raw" in want and "raw" in got:
        out += framing_diff(want["raw"], got["raw"])
        out += shape_diff(collapse(want["events"]), collapse(got["events"]), "events")
    else:
        out += shape_diff(want.get("body"), got.get("body"), "body")
        out += error_diff(want.get("body") or {}, got.get("body") or {})
    return out
