"""A bug anywhere in a call's way is seen: an OpenAI-shaped 500 without the traceback,
the traceback in the log, a count in gateway_requests_total, an access line, and for a
proxied call its ledger row.

The whole app (create_app, its lifespan and Services, the embedded simulator, a SQLite
ledger) runs in process; the bug is put in through a seam: a Services component whose
method raises.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.access import AccessLog
from gateway.services import Services
from tests.integration.conftest import InProcess

MODEL = "sim-model"
SECRET = "the-internal-detail-nobody-may-see"


class Exploding:
    """Stands in for a Services component: the named method raises, the rest pass through."""

    def __init__(self, inner: object, method: str) -> None:
        self._inner, self._method = inner, method

    def __getattr__(self, name: str) -> Any:
        if name == self._method:
            raise RuntimeError(SECRET)
        return getattr(self._inner, name)


def requests_total(svc: Services, **labels: str) -> float:
    return svc.registry.get_sample_value("gateway_requests_total", labels) or 0.0


@pytest.fixture
def access_log(in_process: InProcess, tmp_path: Path) -> Iterator[Path]:
    """The app's access lines, to a file of the test's own."""
    path = tmp_path / "access.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    in_process.services.access = AccessLog(fd)
    yield path
    os.close(fd)


def access_lines(svc: Services, path: Path) -> list[dict[str, Any]]:
    svc.access.flush()
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def assert_hidden_500(resp: httpx.Response) -> None:
    assert resp.status_code == 500
    assert resp.json() == {
        "error": {
            "message": "The gateway failed to handle the request.",
            "type": "internal_error",
            "param": None,
            "code": None,
        }
    }
    assert SECRET not in resp.text
    assert "Traceback" not in resp.text
    assert resp.headers["x-request-id"]


async def test_a_bug_in_a_proxied_call_is_answered_logged_counted_and_metered(
    in_process: InProcess, access_log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    svc = in_process.services
    svc.policy = Exploding(svc.policy, "choose")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    with caplog.at_level(logging.INFO):
        resp = await in_process.client.post("/v1/chat/completions", json=body)

    assert_hidden_500(resp)
    [traceback] = [r for r in caplog.records if r.exc_info is not None]
    assert SECRET in caplog.text
    assert traceback.name == "gateway.pipeline"
    labels = {"model": MODEL, "endpoint": "chat", "status": "500", "error_type": "internal_error"}
    assert requests_total(svc, **labels) == 1
    [line] = access_lines(svc, access_log)
    assert (line["status"], line["error"], line["model"]) == (500, "internal_error", MODEL)
    await svc.ledger.aclose()  # writes what it holds (the lifespan's close is then a no-op)
    with sqlite3.connect(in_process.ledger_db) as conn:
        rows = conn.execute("SELECT status, error_type, model FROM ledger").fetchall()
    assert rows == [(500, "internal_error", MODEL)]


async def test_a_bug_in_an_ordinary_route_is_answered_logged_and_counted(
    in_process: InProcess, access_log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    svc = in_process.services
    real = svc.index
    svc.index = Exploding(real, "size")
    try:
        with caplog.at_level(logging.INFO):
            resp = await in_process.client.get("/metrics")
    finally:
        svc.index = real

    assert_hidden_500(resp)
    assert any(r.exc_info is not None and r.name == "gateway.app" for r in caplog.records)
    labels = {"model": "", "endpoint": "", "status": "500", "error_type": "internal_error"}
    assert requests_total(svc, **labels) == 1
    [line] = access_lines(svc, access_log)
    assert (line["status"], line["error"]) == (500, "internal_error")
    assert (await in_process.client.get("/metrics")).status_code == 200
