"""Slow backends and clients that leave, over real sockets: the gateway and simulators as
processes, the official openai client, the ledger read back from its SQLite file."""

from __future__ import annotations

import http.client
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL, start_sims, write_config
from tests.e2e.gateway.test_failures import sim_counter
from tests.servers import gateway_process

SLOW = ("--prefill-token-ms", "20", "--step-ms", "100")
"""A 200-token prompt takes 4 s to its first token, each further token 0.1 s."""
PROMPT = " ".join(f"word{i}" for i in range(200))


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[str]:
    with ExitStack() as stack:
        yield start_sims(stack, 1, *SLOW)[0]


def ledger(db: Path, n: int) -> list[sqlite3.Row]:
    """The ledger's rows once n have arrived (the writer batches asynchronously)."""
    deadline = time.monotonic() + 10
    while True:
        with sqlite3.connect(db) as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute("SELECT * FROM ledger").fetchall()
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def aborted_once(sim: str, before: float) -> bool:
    """The backend aborted one more request, and runs none (it was told the client left)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        after = sim_counter(sim, "vllm:request_abort_total")
        if after == before + 1 and sim_counter(sim, "vllm:num_requests_running") == 0:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_leaving_before_its_answer_began_is_metered_499_and_aborted(
    slow_sim: str, tmp_path: Path, stream: bool
) -> None:
    cfg = write_config(tmp_path / "g.yaml", [slow_sim])
    before = sim_counter(slow_sim, "vllm:request_abort_total")
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 100, "stream": stream}
    with gateway_process("serve", "--config", str(cfg)) as url:
        with pytest.raises(httpx.ReadTimeout):  # gives up during the 4 s prefill, and leaves
            httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(5, read=1))
        assert aborted_once(slow_sim, before)
        [row] = ledger(tmp_path / "ledger.db", 1)
    assert (row["status"], row["disconnected"], row["error_type"]) == (
        499,
        1,
        "client_closed_request",
    )
    assert row["estimated"] == 1
    assert row["prompt_tokens"] > 200  # the prompt was sent: estimated by the gateway
    assert row["completion_tokens"] == 0


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


def test_streams_on_a_backend_slow_to_first_byte_move_and_it_is_ejected(
    sims: list[str], slow_sim: str, tmp_path: Path
) -> None:
    upstream = {"first_byte_timeout": 0.5, "failure_threshold": 2, "ejection_time": 60}
    cfg = write_config(
        tmp_path / "g.yaml",
        [slow_sim, sims[0]],
        upstream=upstream,
        routing={"policy": "round_robin"},
    )
    slow = slow_sim.removeprefix("http://")
    with gateway_process("serve", "--config", str(cfg)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        for i in range(6):
            stream = client.completions.create(
                model=MODEL, prompt=f"{i} {PROMPT}", max_tokens=2, stream=True
            )
            assert "".join(c.choices[0].text for c in stream if c.choices)
        retried = metric(url, "gateway_upstream_retries_total")
        state = metric(url, "gateway_backend_circuit_state", backend=slow)
        ejections = metric(url, "gateway_backend_ejections_total", backend=slow)
    assert retried == 2  # round robin sent two calls to it before it was ejected
    assert (state, ejections) == (1, 1)


def test_a_client_reading_slowly_gets_its_whole_stream_in_order(tmp_path: Path) -> None:
    """An instant backend sends a stream of some 8 MB at once, more than the kernel's socket
    buffers hold (4 MB at most here), to a client whose socket takes 4 KB and which reads
    nothing for half a second: the gateway's writes to it back up, and its relay stops
    reading the backend until the client has read (a few times over, seen while this test
    was written). Every token arrives once and in order, and the ledger meters them all."""
    tokens = 40_000
    with ExitStack() as stack:
        [sim] = start_sims(stack, 1, "--instant", "--max-model-len", "50000")
        cfg = write_config(tmp_path / "g.yaml", [sim])
        url = stack.enter_context(gateway_process("serve", "--config", str(cfg)))
        body = orjson.dumps({"model": MODEL, "max_tokens": tokens, "stream": True,
                             "messages": [{"role": "user", "content": "count"}]})  # fmt: skip
        sock = socket.socket()
        stack.callback(sock.close)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                     % (len(body), body))  # fmt: skip
        time.sleep(0.5)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        stream = answer.read()
        [row] = ledger(tmp_path / "ledger.db", 1)
    assert answer.status == 200
    events = [e.removeprefix(b"data: ") for e in stream.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert len([p for p in pieces if p]) == tokens  # one event per token: none lost
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert (row["status"], row["completion_tokens"], row["estimated"]) == (200, tokens, 0)
