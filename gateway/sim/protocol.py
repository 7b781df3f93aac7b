"""vLLM's OpenAI dialect: request validation and response bodies, field for field.

Shapes follow vLLM 0.32.0's OpenAI server as run with --enable-prompt-tokens-details
(tests/vllm/fixtures hold its recorded answers): errors are ``{"error": {"message",
"type", "param", "code"}}`` with an integer code and vLLM's wording, usage carries
``prompt_tokens_details.cached_tokens`` (plus vLLM's ``created_cache_tokens`` and
``multimodal_tokens``), and a stream that asked for usage ends with a chunk whose
``choices`` is empty.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.sim import tokenizer
from gateway.sim.config import SimConfig
from gateway.sim.engine import Sequence

VLLM_VERSION = "0.32.0"
"""The vLLM release whose dialect the simulator speaks (tests/vllm/fixtures record it)."""


class SimError(Exception):
    """A request vLLM would refuse; rendered as vLLM's ErrorResponse."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.kind = kind or {400: "BadRequestError", 404: "NotFoundError"}.get(
            status, "InternalServerError"
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }


def invalid(message: str, param: str, value: Any) -> SimError:
    """vLLM's VLLMValidationError: the message ends with its parameter and value."""
    return SimError(f"{message} (parameter={param}, value={value})", param=param)


def validation_error(
    kind: str, loc: str, msg: str, value: Any, ctx: dict[str, str] | None = None
) -> SimError:
    """A request FastAPI's validation refuses before vLLM sees it, worded as vLLM words it.

    vLLM renders each pydantic error as a dict, with containers in `input` described by
    their size, under the type "Bad Request" (the HTTP phrase).
    """
    if isinstance(value, list | dict):
        value = f"<{type(value).__name__} of {len(value)} items>"
    error: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx is not None:
        error["ctx"] = ctx
    return SimError(f"1 validation error:\n  {error}", param=loc, kind="Bad Request")


def invalid_json(raw: bytes) -> SimError:
    """FastAPI's answer to a body that is not JSON: stdlib json's message and position."""
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        ctx = {"error": exc.msg}
        return validation_error("json_invalid", f"body.{exc.pos}", "JSON decode error", {}, ctx)
    except UnicodeDecodeError:
        pass
    return SimError("There was an error parsing the body", kind="Bad Request")


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """What a chat or completions call asks of the engine."""

    prompt: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool


def random_id() -> str:
    return os.urandom(8).hex()


def now() -> int:
    return int(time.time())


def fingerprint(config: SimConfig) -> str:
    """vLLM's system_fingerprint: its version and a hash of the serving configuration."""
    digest = hashlib.sha256(repr(config).encode()).hexdigest()
    return f"vllm-{VLLM_VERSION}-{digest[:8]}"


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise validation_error(
            "model_attributes_type",
            "body",
            "Input should be a valid dictionary or object to extract fields from",
            body,
        )
    return body


def check_model(body: dict[str, Any], config: SimConfig) -> None:
    model = body.get("model")
    if model is not None and model != config.model:
        raise SimError(
            f"The model `{model}` does not exist. Valid aliases: {config.model}.",
            404,
            param="model",
        )


def int_field(body: dict[str, Any], name: str) -> int | None:
    """An integer field as pydantic (lax) accepts it: an int or a whole float."""
    value = body.get(name)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise validation_error("int_type", f"body.{name}", "Input should be a valid integer", value)


def parse_chat(body: dict[str, Any], config: SimConfig) -> GenerateRequest:
    if "messages" not in body:
        raise validation_error("missing", "body.messages", "Field required", body)
    messages = body["messages"]
    if not isinstance(messages, list):
        raise validation_error(
            "list_type", "body.messages", "Input should be a valid list", messages
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise validation_error(
                "model_attributes_type",
                f"body.messages.{i}",
                "Input should be a valid dictionary or object to extract fields from",
                message,
            )
    limit, param = int_field(body, "max_completion_tokens"), "max_completion_tokens"
    if limit is None:
        limit, param = int_field(body, "max_tokens"), "max_tokens"
    check_model(body, config)
    try:
        text = tokenizer.render_chat(messages, body.get("add_generation_prompt", True) is not False)
    except TypeError as exc:
        raise SimError(str(exc), param="messages") from exc
    return generate_request(tokenizer.encode(text), True, limit, param, body, config)


def parse_completion(body: dict[str, Any], config: SimConfig) -> GenerateRequest:
    limit = int_field(body, "max_tokens")
    check_model(body, config)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, str):
        tokens, from_text = tokenizer.encode(prompt), True
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        tokens, from_text = prompt, False
    else:
        raise SimError(
            "'prompt' must be a string, a list of one string or a list of token ids",
            param="prompt",
        )
    return generate_request(tokens, from_text, limit, "max_tokens", body, config)


def prompt_too_long(n: int, cap: int) -> SimError:
    """vLLM's refusal of a prompt longer than the context, output tokens aside.

    vLLM tokenizes text with truncation at cap + 1 tokens, so it can only say "at least".
    """
    qualifier = "at least " if n == cap + 1 else ""
    return invalid(
        f"This model's maximum context length is {cap} tokens. However, your prompt "
        f"contains {qualifier}{n} input tokens, which exceeds this limit even without any "
        "output tokens. Please reduce the length of the input prompt.",
        "input_tokens",
        n,
    )


def generate_request(
    prompt: list[int],
    from_text: bool,
    limit: int | None,
    param: str,
    body: dict[str, Any],
    config: SimConfig,
) -> GenerateRequest:
    """The checks vLLM makes, in its order: output limit, prompt length, then max_tokens."""
    cap = config.max_model_len
    if limit is not None and limit > cap:
        raise invalid(
            f"{param}={limit} cannot be greater than max_model_len={cap}. "
            "Please request fewer output tokens.",
            param,
            limit,
        )
    n = len(prompt)
    if n > cap:
        raise prompt_too_long(min(n, cap + 1) if from_text else n, cap)
    if (body.get("n") or 1) != 1:
        raise SimError("the simulator only supports n=1", param="n")
    if not prompt:
        raise SimError("The decoder prompt cannot be empty", param="prompt")
    # vLLM cuts the output at the context's end; a request without max_tokens gets the
    # simulator's default length instead of vLLM's whole remaining context.
    room = cap - n
    if limit is None and config.default_max_tokens > room:
        limit = room
    elif limit is not None:
        limit = min(limit, room)
    if limit is not None and limit < 1:
        raise invalid(f"max_tokens must be at least 1, got {limit}.", "max_tokens", limit)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return GenerateRequest(prompt, limit, bool(body.get("stream")), include_usage)


def usage(seq: Sequence, details: dict[str, Any]) -> dict[str, Any]:
    p, c = len(seq.prompt), len(seq.output)
    return {
        "prompt_tokens": p,
        "total_tokens": p + c,
        "completion_tokens": c,
        "prompt_tokens_details": details,
    }


def _message(text: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }


@dataclass(frozen=True, slots=True)
class Reply:
    """What every body of one answer shares: its id, creation time, model and kind.

    Bodies follow vLLM 0.32.0 key for key (tests/vllm/fixtures hold its answers): its
    extra null fields, the fingerprint only on a stream's last chunk, and the keys of
    prompt_tokens_details, which differ by endpoint and by streamed or not.
    """

    chat: bool
    model: str
    fingerprint: str
    include_usage: bool = False
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
        head: dict[str, Any] = {"index": 0}
        tail = {"logprobs": None, "finish_reason": seq.finish_reason, "stop_reason": None}
        created = seq.created_cache_tokens if self.chat else None
        details = {
            "cached_tokens": seq.cached_tokens,
            "created_cache_tokens": created,
            "multimodal_tokens": None,
        }
        extra: dict[str, Any] = {
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": {**usage(seq, details), "completion_tokens_details": None},
        }
        if self.chat:
            choice = {**head, "message": _message(text), **tail, "token_ids": None}
            extra |= {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
        else:
            choice = {**head, "text": text, **tail, "token_ids": None, "prompt_logprobs": None}
            choice["prompt_token_ids"] = None
        choice["routed_experts"] = None
        extra |= {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        return self._body("chat.completion" if self.chat else "text_completion", [choice], **extra)

    def opening(self) -> dict[str, Any]:
        """A chat stream's first chunk: the assistant's role, and vLLM's prompt fields."""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._body(
            "chat.completion.chunk", [choice], prompt_token_ids=None, prompt_text=None
        )

    def chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        """One streamed token; the last one names the finish reason.

        Without a usage chunk to follow, the last token's chunk carries the fingerprint.
        """
        extra = (
            {} if finish is None or self.include_usage else {"system_fingerprint": self.fingerprint}
        )
        if not self.chat:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            choice |= {"stop_reason": None, "prompt_token_ids": None, "token_ids": None}
            return self._body("text_completion", [choice], **extra)
        choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        return self._body("chat.completion.chunk", [choice], **extra)

    def usage_chunk(self, seq: Sequence) -> dict[str, Any]:
        """The last chunk of a stream that asked for usage: no choices, only usage.

        vLLM serializes this chunk without its null fields, so a completion's (always
        null) created_cache_tokens is left out.
        """
        details = {"cached_tokens": seq.cached_tokens}
        if self.chat:
            details["created_cache_tokens"] = seq.created_cache_tokens
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._body(obj, [], usage=usage(seq, details), system_fingerprint=self.fingerprint)


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
