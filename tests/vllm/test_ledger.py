"""The ledger row of each call holds exactly the token counts real vLLM reported."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(120, func_only=True)]

MESSAGES = [{"role": "user", "content": "What does the ledger record?"}]
BASE = {"model": "tiny", "temperature": 0, "max_tokens": 6, "ignore_eos": True}


def call(gateway_url: str, path: str, body: dict[str, Any]) -> tuple[str, str]:
    """Send a call through the gateway; its request id and the body the client received."""
    r = httpx.post(gateway_url + path, json=body, timeout=30)
    r.raise_for_status()
    return r.headers["x-gateway-request-id"], r.text


def received_usage(text: str, stream: bool) -> dict[str, Any]:
    if not stream:
        return json.loads(text)["usage"]
    events = [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
    return next(e["usage"] for e in events if e.get("usage"))


def ledger_row(db: Path, request_id: str) -> sqlite3.Row:
    """The call's row, once the batched writer has put it there."""
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(db) as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM ledger WHERE request_id = ?", (request_id,))
            found = row.fetchone()
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
