"""vLLM's Responses API (``POST /v1/responses``), body for body, over the same engine.

Shapes follow vLLM 0.32.0 (tests/vllm/fixtures/responses*.json): ``instructions`` become
a system message before the ``input`` items, so the prompt is rendered like chat's and a
repeated one is cached like chat's. A stream is typed SSE events (``event: <type>`` then
its data), opened by ``response.created`` and ``response.in_progress`` as soon as the
request is accepted (before prefill, as vLLM sends them) and closed by
``response.completed``, which carries the usage; there is no ``[DONE]``. As with vLLM's
default (no ``VLLM_ENABLE_RESPONSES_API_STORE``), nothing is stored: a
``previous_response_id`` is never found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.sim import tokenizer
from gateway.sim.config import SimConfig
from gateway.sim.engine import Sequence
from gateway.sim.protocol import (
    GenerateRequest,
    SimError,
    check_model,
    generate_request,
    int_field,
    now,
    random_id,
    validation_error,
)


def parse_responses(body: dict[str, Any], config: SimConfig) -> GenerateRequest:
    if "input" not in body:
        # vLLM's validators have set tool_choice (without tools: "none") by then.
        seen = body if body.get("tools") else {**body, "tool_choice": "none"}
        raise validation_error("missing", "body.input", "Field required", seen)
    max_output = int_field(body, "max_output_tokens")
    check_model(body, config)
    previous = body.get("previous_response_id")
    if previous is not None:
        raise SimError(
            f"Response with id '{previous}' not found.",
            404,
            param="response_id",
            kind="invalid_request_error",
        )
    try:
        text = tokenizer.render_chat(messages(body))
    except TypeError as exc:
        raise SimError(str(exc), param="input") from exc
    return generate_request(
        tokenizer.encode(text), True, max_output, "max_output_tokens", body, config
    )


def messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation the prompt renders: instructions, then the input's messages."""
    items = body["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise validation_error("list_type", "body.input", "Input should be a valid list", items)
    instructions = body.get("instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    return system + items


@dataclass(slots=True)
class ResponsesReply:
    """One answer's ids and echoed request fields; its events count their sequence."""

    model: str
    request: dict[str, Any]
    rid: str = field(default_factory=random_id)
    mid: str = field(default_factory=random_id)
    created: int = field(default_factory=now)
    sequence: int = 0

    def whole(self, seq: Sequence) -> dict[str, Any]:
        """The non-streamed answer (and ``response.completed``'s response)."""
        text = tokenizer.detokenize(seq.output)
        incomplete = seq.finish_reason == "length"
        prompt, output = len(seq.prompt), len(seq.output)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {
                "cached_tokens": seq.cached_tokens,
                "cache_write_tokens": seq.created_cache_tokens,
                "input_tokens_per_turn": [],
                "cached_tokens_per_turn": [],
            },
            "output_tokens": output,
            "output_tokens_details": {
                "reasoning_tokens": 0,
                "tool_output_tokens": 0,
                "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": [],
            },
            "total_tokens": prompt + output,
        }
        return self._response(
            status="incomplete" if incomplete else "completed",
            incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
            output=[self._item(text, "completed", logprobs=None)],
            usage=usage,
        )

    def opening(self) -> bytes:
        """``response.created`` and ``response.in_progress``: sent before prefill."""
        head = self._response(status="in_progress", incomplete_details=None, output=[], usage=None)
        return self._event("response.created", response=head) + self._event(
            "response.in_progress", response=head
        )

    def first(self) -> bytes:
        """The message item and its text part opening, sent with the first token."""
        item = self._event("response.output_item.added", item=self._item(None, "in_progress"),
                           output_index=0)  # fmt: skip
        part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
        return item + self._event(
            "response.content_part.added", content_index=0, item_id=self._msg_id,
            output_index=0, part=part,
        )  # fmt: skip

    def delta(self, text: str) -> bytes:
        return self._event(
            "response.output_text.delta", content_index=0, delta=text, item_id=self._msg_id,
            logprobs=[], output_index=0,
        )  # fmt: skip

    def closing(self, seq: Sequence) -> bytes:
        """The text's, part's and item's ends, then ``response.completed`` with usage."""
        text = tokenizer.detokenize(seq.output)
        part: dict[str, Any] = {
            "annotations": [],
            "text": text,
            "type": "output_text",
            "logprobs": None,
        }
        return b"".join((
            self._event("response.output_text.done", content_index=0, item_id=self._msg_id,
                        logprobs=[], output_index=0, text=text),
            self._event("response.content_part.done", content_index=0, item_id=self._msg_id,
                        output_index=0, part=part),
            self._event("response.output_item.done", item=self._item(text, "completed",
                        logprobs=None), output_index=0),
            self._event("response.completed", response=self.whole(seq)),
        ))  # fmt: skip

    @property
    def _msg_id(self) -> str:
        return "msg_" + self.mid

    def _item(self, text: str | None, status: str, logprobs: Any = None) -> dict[str, Any]:
        content = []
        if text is not None:
            content.append({"annotations": [], "text": text, "type": "output_text",
                            "logprobs": logprobs})  # fmt: skip
        return {"id": self._msg_id, "content": content, "role": "assistant", "status": status,
                "type": "message", "phase": None}  # fmt: skip

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {**fields, "sequence_number": self.sequence, "type": kind}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _response(self, **state: Any) -> dict[str, Any]:
        r = self.request
        return {
            "id": "resp_" + self.rid,
            "created_at": self.created,
            "incomplete_details": state["incomplete_details"],
            "instructions": r.get("instructions"),
            "metadata": r.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": state["output"],
            "parallel_tool_calls": r.get("parallel_tool_calls", True),
            "temperature": float(r.get("temperature", 1.0)),
            "tool_choice": "none",
            "tools": [],
            "top_p": float(r.get("top_p", 1.0)),
            "background": False,
            "max_output_tokens": r.get("max_output_tokens"),
            "max_tool_calls": None,
            "previous_response_id": None,
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": state["status"],
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": state["usage"],
            "user": r.get("user"),
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }
