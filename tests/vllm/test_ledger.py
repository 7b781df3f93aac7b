"""The ledger row of each call holds exactly the token counts real vLLM reported."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseCompletedEvent, ResponseTextDeltaEvent
from openai.types.responses.response_create_params import ResponseCreateParamsBase

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(120, func_only=True)]

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What does the ledger record?"}
]
BASE = {"model": "tiny", "temperature": 0, "max_tokens": 6, "ignore_eos": True}


def call(gateway_url: str, path: str, body: dict[str, Any]) -> tuple[str, str]:
    """Send a call through the gateway; its request id and the body the client received."""
    r = httpx.post(gateway_url + path, json=body, timeout=30)
    r.raise_for_status()
    return r.headers["x-gateway-request-id"], r.text


def received_usage(text: str, stream: bool) -> dict[str, Any]:
    usage: dict[str, Any]
    if not stream:
        usage = json.loads(text)["usage"]
        return usage
    events = [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
    usage = next(e["usage"] for e in events if e.get("usage"))
    return usage


def ledger_row(db: Path, request_id: str) -> sqlite3.Row:
    """The call's row, once the batched writer has put it there."""
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(db) as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM ledger WHERE request_id = ?", (request_id,))
            found: sqlite3.Row | None = row.fetchone()
        if found is not None or time.monotonic() > deadline:
            assert found is not None, f"no ledger row for {request_id}"
            return found
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES}),
        ("/v1/chat/completions", {"messages": MESSAGES, "stream": True,
                                  "stream_options": {"include_usage": True}}),
        ("/v1/completions", {"prompt": "ledger = []", "stream": True,
                             "stream_options": {"include_usage": True}}),
    ],
    ids=["chat", "chat-stream", "completion-stream"],
)  # fmt: skip
def test_ledger_holds_vllm_usage(
    gateway_url: str, gateway_dir: Path, path: str, body: dict[str, Any]
) -> None:
    request_id, text = call(gateway_url, path, {**BASE, **body})
    usage = received_usage(text, bool(body.get("stream")))
    row = ledger_row(gateway_dir / "gateway.db", request_id)
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (
        usage["prompt_tokens"],
        cached,
        usage["completion_tokens"],
    )
    assert row["input_tokens"] == usage["prompt_tokens"] - cached
    assert row["estimated"] == 0
    assert row["status"] == 200


def test_ledger_holds_vllm_usage_the_client_did_not_ask_for(
    gateway_url: str, gateway_dir: Path, vllm_urls: list[str]
) -> None:
    # The gateway asks vLLM for usage on every stream and strips it when unwanted.
    body = {**BASE, "messages": MESSAGES, "stream": True}
    request_id, text = call(gateway_url, "/v1/chat/completions", body)
    assert '"usage"' not in text
    want = httpx.post(vllm_urls[0] + "/v1/chat/completions", json={**BASE, "messages": MESSAGES},
                      timeout=30).json()["usage"]  # fmt: skip
    row = ledger_row(gateway_dir / "gateway.db", request_id)
    assert (row["prompt_tokens"], row["completion_tokens"], row["estimated"]) == (
        want["prompt_tokens"],
        6,
        0,
    )


LONG = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(40))


def test_the_responses_api_through_the_gateway_is_cached_and_metered_as_vllm_reports(
    gateway_url: str, gateway_dir: Path
) -> None:
    """The official SDK's responses.create, whole then streamed, on a repeated long
    prompt: vLLM's cached tokens grow, and each ledger row holds vLLM's usage."""
    with openai.OpenAI(base_url=gateway_url + "/v1", api_key="x", max_retries=0) as client:
        args: ResponseCreateParamsBase = {"model": "tiny", "instructions": LONG, "input": "Go on.",
                                          "temperature": 0, "max_output_tokens": 6}  # fmt: skip
        greedy = {"ignore_eos": True}
        first = client.responses.with_raw_response.create(**args, extra_body=greedy)
        stream = client.responses.with_raw_response.create(**args, stream=True, extra_body=greedy)
        events = list(stream.parse())
    whole = first.parse()
    done = events[-1]
    assert events[0].type == "response.created"
    assert isinstance(done, ResponseCompletedEvent), done.type
    assert whole.usage is not None
    assert done.response.usage is not None
    assert done.response.usage.input_tokens_details.cached_tokens > 0
    for raw, used in ((first, whole.usage), (stream, done.response.usage)):
        row = ledger_row(gateway_dir / "gateway.db", raw.headers["x-gateway-request-id"])
        cached = used.input_tokens_details.cached_tokens
        assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (
            used.input_tokens, cached, used.output_tokens)  # fmt: skip
        assert (row["endpoint"], row["status"], row["estimated"]) == ("responses", 200, 0)
    assert done.response.output_text == "".join(
        e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)
    )
