"""The Responses API's request (``POST /v1/responses``) as the gateway reads it.

Its prompt is ``instructions`` then the ``input`` items, which vLLM renders with the chat
template exactly as it renders chat messages: so the prefix stage hashes a Responses call
as the chat call with the same conversation (``as_chat``), and the two share cached
prefixes on a backend. Input items of the wrong shape are refused at parse, naming the
field; item types the gateway does not read (function calls and their outputs,
reasoning) pass to the backend, which judges them.

``previous_response_id`` is refused: it names a response stored by one backend (vLLM
stores none unless started with ``VLLM_ENABLE_RESPONSES_API_STORE``), and the gateway
places each call on the backend where it is served soonest, so it cannot promise that
backend. A client sends the conversation as ``input`` instead, which every backend can
serve and whose shared prefix the routing follows.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest
from gateway.stages.messages import wrong_type

TEXT_PARTS = frozenset({"input_text", "output_text"})


def check(data: dict[str, Any]) -> None:
    """Raise InvalidRequest naming the first field the gateway cannot read as a prompt."""
    if data.get("previous_response_id") is not None:
        raise InvalidRequest(
            "'previous_response_id' is not supported by this gateway: it routes each call "
            "to any backend, and only the one that stored a response could continue it. "
            "Send the conversation so far as 'input' instead.",
            param="previous_response_id",
        )
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise wrong_type("instructions", instructions)
    items = data["input"]
    if isinstance(items, str):
        return
    if not isinstance(items, list):
        raise wrong_type("input", items, "a string or an array of input items")
    for i, item in enumerate(items):
        _check_item(item, f"input[{i}]")


def _check_item(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise wrong_type(where, item, "an object")
    if "role" not in item:
        return  # not a message: a function call, its output, reasoning...
    if not isinstance(item["role"], str):
        raise wrong_type(f"{where}.role", item["role"])
    content = item.get("content")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise wrong_type(f"{where}.content", content, "a string or an array of content parts")
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise wrong_type(f"{where}.content[{j}]", part, "an object")
        if part.get("type") in TEXT_PARTS and not isinstance(part.get("text"), str):
            raise wrong_type(f"{where}.content[{j}].text", part.get("text"))


def as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat body with the same conversation: instructions as the system message, the
    input's messages in order (text parts as chat's text parts), and the tools."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    instructions = body.get("instructions")
    messages = [{"role": "system", "content": instructions}] if instructions else []
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and "role" in item:
            messages.append({"role": item["role"], "content": _chat_content(item.get("content"))})
        elif isinstance(item, dict):
            messages.append({"role": "item", "content": None, **item})
    return {"messages": messages, "tools": body.get("tools")}


def _chat_content(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    return [
        {"type": "text", "text": p["text"]}
        if isinstance(p, dict) and p.get("type") in TEXT_PARTS
        else p
        for p in content
    ]
