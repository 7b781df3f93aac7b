"""Record real vLLM responses as reference fixtures for the simulator's conformance test.

Run against a server started by deploy/vllm-cpu/serve.sh (it serves the tiny model as
`tiny`), from the project's virtualenv:

    python -m tests.vllm.capture http://127.0.0.1:8100 tests/vllm/fixtures

Each fixture is {"request": ..., "status": ..., "content_type": ..., "body": ...} for a
plain response, or "raw" (the exact SSE text) and "events" (each data payload, parsed
when it is JSON) for a stream. Values such as ids and times vary; the shapes do not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx

# A prompt of about 1,400 tokens: long enough to fill many 32-token KV blocks.
LONG_TEXT = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(58))
TOO_LONG_TEXT = "word " * 6000
# Fixtures name the long texts instead of holding them; expand() puts them back.
PLACEHOLDERS = {LONG_TEXT: "<LONG_TEXT>", TOO_LONG_TEXT: "<TOO_LONG_TEXT>"}
# The metrics a gateway scrapes or a test asserts on; the excerpt keeps their label sets.
KEY_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:time_to_first_token_seconds_count",
)
GREEDY = {"temperature": 0, "max_tokens": 5}
RESPONSES = {"temperature": 0, "max_output_tokens": 5}
# Streams run longer, so a middle chunk always separates the first from the last even when
# vLLM puts several tokens in one chunk.
STREAMED = {"temperature": 0, "max_tokens": 12, "ignore_eos": True, "stream": True}

PLAIN: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], **GREEDY},
    ),
    "completion": ("/v1/completions", {"model": "tiny", "prompt": "def hello():", **GREEDY}),
    "error_unknown_model": (
        "/v1/chat/completions",
        {"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]},
    ),
    "error_missing_messages": ("/v1/chat/completions", {"model": "tiny"}),
    "error_max_tokens_zero": (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0},
    ),
    "error_prompt_too_long": (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": TOO_LONG_TEXT}]},
    ),
    "error_completion_prompt_too_long": (
        "/v1/completions",
        {"model": "tiny", "prompt": TOO_LONG_TEXT, "max_tokens": 5},
    ),
    "error_invalid_json": ("/v1/chat/completions", {}),
    "embeddings": ("/v1/embeddings", {"model": "tiny", "input": "Hello"}),
    "responses": (
        "/v1/responses",
        {"model": "tiny", "input": "Hello", "instructions": "Be brief.", **RESPONSES},
    ),
    "responses_items": (
        "/v1/responses",
        {
            "model": "tiny",
            "input": [
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi."},
                {"role": "user", "content": [{"type": "input_text", "text": "And?"}]},
            ],
            **RESPONSES,
        },
    ),
    "error_responses_missing_input": ("/v1/responses", {"model": "tiny"}),
    "error_responses_unknown_model": ("/v1/responses", {"model": "no-such-model", "input": "Hi"}),
    "error_responses_previous_response_id": (
        "/v1/responses",
        {"model": "tiny", "input": "Hi", "previous_response_id": "resp_0123456789abcdef"},
    ),
    "error_stream_unknown_model": (
        "/v1/chat/completions",
        {
            "model": "no-such-model",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
        },
    ),
}

STREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "responses_stream": (
        "/v1/responses",
        {
            "model": "tiny",
            "input": "Hello",
            "instructions": "Be brief.",
            **RESPONSES,
            "max_output_tokens": 12,
            "stream": True,
        },
    ),
    "chat_stream_usage": (
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hello"}],
            "stream_options": {"include_usage": True},
            **STREAMED,
        },
    ),
    "chat_stream": (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], **STREAMED},
    ),
    "completion_stream_usage": (
        "/v1/completions",
        {
            "model": "tiny",
            "prompt": "def hello():",
            "stream_options": {"include_usage": True},
            **STREAMED,
        },
    ),
    "completion_stream": (
        "/v1/completions",
        {"model": "tiny", "prompt": "def hello():", **STREAMED},
    ),
}


def abbreviate(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: abbreviate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [abbreviate(v) for v in value]
    return PLACEHOLDERS.get(value, value) if isinstance(value, str) else value


def expand(value: Any) -> Any:
    """A fixture's request body with the long texts put back, ready to send again."""
    texts = {v: k for k, v in PLACEHOLDERS.items()}
    if isinstance(value, dict):
        return {k: expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v) for v in value]
    return texts.get(value, value) if isinstance(value, str) else value


def response_meta(r: httpx.Response) -> dict[str, Any]:
    return {
        "status": r.status_code,
        "content_type": r.headers.get("content-type"),
        "header_names": sorted(r.headers.keys()),
    }


def plain(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    # An empty body stands for "not JSON at all", to record the invalid-JSON error.
    content = json.dumps(body) if body else "{not json"
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    request = {"path": path, "body": abbreviate(body)}
    return {"request": request, **response_meta(r), "body": r.json()}


def stream(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with client.stream("POST", path, json=body) as r:
        raw = r.read().decode()
        meta = response_meta(r)
    events: list[Any] = []
    for block in raw.split("\n\n"):
        for line in block.split("\n"):  # a Responses event is `event: <type>` then its data
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    request = {"path": path, "body": abbreviate(body)}
    return {"request": request, **meta, "raw": raw, "events": events}


def cached_repeat(client: httpx.Client) -> dict[str, Any]:
    """The same long prompt twice: the second response shows cached_tokens > 0."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": LONG_TEXT}], **GREEDY}
    first = plain(client, "/v1/chat/completions", body)
    second = plain(client, "/v1/chat/completions", body)
    return {"first": first, "repeat": second}


def metric_names(exposition: str) -> list[str]:
    """Every vllm: sample name, without prometheus_client's `_created` companions."""
    names = {line.split("{")[0].split(" ")[0] for line in exposition.splitlines()}
    return sorted(n for n in names if n.startswith("vllm:") and not n.endswith("_created"))


def metrics_excerpt(exposition: str) -> list[str]:
    return [line for line in exposition.splitlines() if line.startswith(KEY_METRICS)]


def write(out: Path, name: str, data: Any) -> None:
    (out / f"{name}.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def details_keys(answers: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """The keys of usage.prompt_tokens_details in each answer that has usage."""
    out = {}
    for name, answer in answers.items():
        bodies = answer.get("events") or [answer.get("body")]
        for body in bodies:
            usage = body.get("usage") if isinstance(body, dict) else None
            if isinstance(usage, dict) and "prompt_tokens_details" in usage:
                out[name] = sorted(usage["prompt_tokens_details"] or {})
    return out


def main(argv: list[str]) -> int:
    base, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=base, timeout=60) as client:
        write(out, "models", {"status": 200, "body": client.get("/v1/models").json()})
        answers = {name: plain(client, path, body) for name, (path, body) in PLAIN.items()}
        answers |= {name: stream(client, path, body) for name, (path, body) in STREAMS.items()}
        for name, answer in answers.items():
            write(out, name, answer)
        write(out, "prompt_tokens_details_keys", details_keys(answers))
        write(out, "cached_repeat", cached_repeat(client))
        exposition = client.get("/metrics").text
        (out / "metric_names.txt").write_text("\n".join(metric_names(exposition)) + "\n")
        (out / "metrics_excerpt.txt").write_text("\n".join(metrics_excerpt(exposition)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
