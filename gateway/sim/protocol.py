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
from dataclasses import dataclass
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
    if body.get("n", 1) != 1:
        raise SimError("the simulator only supports n=1", param="n")
    n, cap = len(prompt), config.max_model_len
    if n > cap or (limit is not None and n + limit > cap):
        raise SimError(
            f"This model's maximum context length is {cap} tokens. However, you requested "
            f"{n + (limit or 0)} tokens ({n} in the messages, {limit or 0} in the completion). "
            "Please reduce the length of the messages or completion.",
            param="input_tokens",
        )
    if limit is None:
        limit_left = cap - n
        limit = None if config.default_max_tokens <= limit_left else limit_left
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


def chat_response(rid: str, created: int, model: str, seq: Sequence) -> dict[str, Any]:
    message = {
        "role": "assistant",
        "content": tokenizer.detokenize(seq.output),
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        "reasoning": None,
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": seq.finish_reason,
        "stop_reason": None,
        "token_ids": None,
    }
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(seq),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }


def completion_response(rid: str, created: int, model: str, seq: Sequence) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": tokenizer.detokenize(seq.output),
        "logprobs": None,
        "finish_reason": seq.finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
    }
    return {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(seq),
        "kv_transfer_params": None,
    }


def chat_chunk(
    rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def completion_chunk(
    rid: str, created: int, model: str, text: str, finish: str | None
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }
    return {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def usage_chunk(rid: str, obj: str, created: int, model: str, seq: Sequence) -> dict[str, Any]:
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(seq),
    }


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


def now() -> int:
    return int(time.time())
