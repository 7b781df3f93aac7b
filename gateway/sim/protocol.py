"""vLLM's OpenAI dialect: request validation and response bodies, field for field.

Shapes follow vLLM's OpenAI server as run with --enable-prompt-tokens-details: errors
are ``{"error": {"message", "type", "param", "code"}}`` with an integer code, usage
carries ``prompt_tokens_details.cached_tokens`` (plus vLLM's ``created_cache_tokens``
and ``multimodal_tokens``), and a stream that asked for usage ends with a chunk whose
``choices`` is empty.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.sim import tokenizer
from gateway.sim.config import SimConfig
from gateway.sim.engine import Sequence


class SimError(Exception):
    """A request vLLM would refuse; rendered as vLLM's ErrorResponse."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(
            self.status, "InternalServerError"
        )
        return {
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.status,
            }
        }


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """What a chat or completions call asks of the engine."""

    prompt: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool


def random_id() -> str:
    return os.urandom(16).hex()


def now() -> int:
    return int(time.time())


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise SimError("Request body must be a JSON object")
    return body


def check_model(body: dict[str, Any], config: SimConfig) -> None:
    model = body.get("model")
    if model is not None and model != config.model:
        raise SimError(f"The model `{model}` does not exist.", 404)


def parse_chat(body: dict[str, Any], config: SimConfig) -> GenerateRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise SimError(
            "Field required: 'messages' must be a list of message objects", param="messages"
        )
    try:
        text = tokenizer.render_chat(messages, body.get("add_generation_prompt", True) is not False)
    except TypeError as exc:
        raise SimError(str(exc), param="messages") from exc
    limit = body.get("max_completion_tokens")
    param = "max_completion_tokens"
    if limit is None:
        limit, param = body.get("max_tokens"), "max_tokens"
    return _generate_request(tokenizer.encode(text), limit, param, body, config)


def parse_completion(body: dict[str, Any], config: SimConfig) -> GenerateRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, str):
        tokens = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        tokens = prompt
    else:
        raise SimError(
            "'prompt' must be a string, a list of one string or a list of token ids",
            param="prompt",
        )
    return _generate_request(tokens, body.get("max_tokens"), "max_tokens", body, config)


def _generate_request(
    prompt: list[int], limit: Any, param: str, body: dict[str, Any], config: SimConfig
) -> GenerateRequest:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise SimError(f"{param} must be at least 1, got {limit}.", param=param)
    if (body.get("n") or 1) != 1:
        raise SimError("the simulator only supports n=1", param="n")
    if not prompt:
        raise SimError("The decoder prompt cannot be empty", param="prompt")
    n, cap = len(prompt), config.max_model_len
    # At least one token must fit after the prompt.
    if n >= cap or (limit is not None and n + limit > cap):
        raise SimError(
            f"This model's maximum context length is {cap} tokens. However, you requested "
            f"{n + (limit or 0)} tokens ({n} in the messages, {limit or 0} in the completion). "
            "Please reduce the length of the messages or completion.",
            param="input_tokens",
        )
    if limit is None and config.default_max_tokens > cap - n:
        limit = cap - n  # the default answer would not fit: it stops at the context end
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return GenerateRequest(prompt, limit, bool(body.get("stream")), include_usage)


def usage(seq: Sequence) -> dict[str, Any]:
    p, c = len(seq.prompt), len(seq.output)
    return {
        "prompt_tokens": p,
        "total_tokens": p + c,
        "completion_tokens": c,
        "prompt_tokens_details": {
            "cached_tokens": seq.cached_tokens,
            "created_cache_tokens": seq.created_cache_tokens,
            "multimodal_tokens": None,
        },
    }


def _message(text: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        "reasoning": None,
    }


@dataclass(frozen=True, slots=True)
class Reply:
    """What every body of one answer shares: its id, creation time, model and kind."""

    chat: bool
    model: str
    rid: str = field(default_factory=random_id)
    created: int = field(default_factory=now)

    def _body(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        head = {
            "id": prefix + self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
        }
        return {**head, "choices": choices, **extra}

    def whole(self, seq: Sequence) -> dict[str, Any]:
        """The non-streamed answer."""
        text = tokenizer.detokenize(seq.output)
        choice: dict[str, Any] = {"index": 0}
        choice |= {"message": _message(text)} if self.chat else {"text": text}
        choice |= {"logprobs": None, "finish_reason": seq.finish_reason, "stop_reason": None}
        choice["token_ids"] = None
        extra: dict[str, Any] = {
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(seq),
        }
        if self.chat:
            extra |= {"prompt_logprobs": None, "prompt_token_ids": None}
        else:
            choice |= {"prompt_logprobs": None, "prompt_token_ids": None}
        extra["kv_transfer_params"] = None
        return self._body("chat.completion" if self.chat else "text_completion", [choice], **extra)

    def chunk(self, text: str, finish: str | None, role: bool = False) -> dict[str, Any]:
        """One streamed token (or, for chat, the opening role delta)."""
        if not self.chat:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            return self._body("text_completion", [{**choice, "stop_reason": None}])
        delta = {"role": "assistant", "content": text} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        return self._body("chat.completion.chunk", [choice])

    def usage_chunk(self, seq: Sequence) -> dict[str, Any]:
        """The last chunk of a stream that asked for usage: no choices, only usage.

        vLLM serializes this chunk without its null fields.
        """
        u = usage(seq)
        details = u["prompt_tokens_details"]
        u["prompt_tokens_details"] = {k: v for k, v in details.items() if v is not None}
        return self._body("chat.completion.chunk" if self.chat else "text_completion", [], usage=u)


def models(config: SimConfig, created: int) -> dict[str, Any]:
    permission = {
        "id": f"modelperm-{random_id()}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": config.model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": config.model,
        "parent": None,
        "max_model_len": config.max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}
