"""SIGTERM drains: calls in flight finish and are metered, the process exits 0.

A real gateway process in front of a real simulator; the signal arrives while streamed and
whole-body calls are all still generating.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import MODEL, start_sims, write_config
from tests.servers import ROOT, free_port, wait_http

MAX_TOKENS = 120
"""About 1.5 s of decoding at the simulator's default step: long enough to be cut."""


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with ExitStack() as stack:
        yield start_sims(stack, 1)[0]


@contextmanager
def gateway(config: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """`gateway serve` as a process of this test's own: the test sends its signal and
    reads its exit status (killed at the end if it is still there)."""
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="gw-term-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", proc, 30, log)
        yield proc, url, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.unlink(missing_ok=True)


def in_flight(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gateway_backend_in_flight_requests{")
    )


def call(url: str, stream: bool, results: list[tuple[int, int]]) -> None:
    """One call; records (status, completion tokens it reported), status 0 if cut off."""
    try:
        results.append(send(url, stream))
    except httpx.HTTPError:
        results.append((0, 0))


def send(url: str, stream: bool) -> tuple[int, int]:
    body = {"model": MODEL, "prompt": "count slowly", "max_tokens": MAX_TOKENS, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
            tokens = 0
            for line in resp.iter_lines():
                event = json.loads(line[6:]) if line.startswith("data: {") else {}
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
            return resp.status_code, tokens
    resp = httpx.post(url + "/v1/completions", json=body, timeout=30)
    if resp.status_code != 200:
        return resp.status_code, 0
    return resp.status_code, resp.json()["usage"]["completion_tokens"]


def ledger(db: Path) -> list[tuple[int, bool, int]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT status, disconnected, completion_tokens FROM ledger").fetchall()


def test_sigterm_lets_calls_in_flight_finish_meters_them_and_exits_0(
    sim: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "g.yaml", [sim])
    with gateway(config) as (proc, url, log):
        results: list[tuple[int, int]] = []
        threads = [threading.Thread(target=call, args=(url, i % 2 == 0, results)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while in_flight(url) < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert in_flight(url) == 8  # every call is upstream, none has finished

        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        status = proc.wait(30)
        output = log.read_text(errors="replace")

    assert status == 0, output
    assert sorted(results) == [(200, MAX_TOKENS)] * 8
    assert sorted(ledger(tmp_path / "ledger.db")) == [(200, False, MAX_TOKENS)] * 8
    assert "Traceback" not in output


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_call_beyond_the_drain_timeout_is_cut_and_still_metered(
    sim: str, tmp_path: Path, stream: bool
) -> None:
    config = write_config(tmp_path / "g.yaml", [sim], server={"drain_timeout": 0})
    with gateway(config) as (proc, url, log):
        results: list[tuple[int, int]] = []
        caller = threading.Thread(target=call, args=(url, stream, results))
        caller.start()
        deadline = time.monotonic() + 10
        while in_flight(url) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        caller.join(30)
        status = proc.wait(30)
        output = log.read_text(errors="replace")

    assert status == 0, output
    rows = ledger(tmp_path / "ledger.db")
    # Cut before its end: a stream mid-way, a whole answer with 503 (shutting_down).
    assert results == [(0, 0) if stream else (503, 0)]
    assert len(rows) == 1, output
    assert rows[0][2] < MAX_TOKENS  # cut off: metered for what it produced
    if not stream:
        assert rows[0][0] == 503
