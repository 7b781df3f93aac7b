"""A client that reads a stream to its [DONE] event and hangs up at once got the whole
answer: no disconnect is counted, even when the backend closes its stream a little later."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from tests.e2e.conftest import MODEL, write_config
from tests.e2e.metrics.traffic import scrape
from tests.servers import free_port, gateway_process

CALLS = 5
LINGER = 0.3
"""Seconds the fake backend keeps its stream open after [DONE]."""


async def lingering_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "length"}],
    }
    usage = {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}  # fmt: skip
    for event in (chunk, usage):
        await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await asyncio.sleep(LINGER)
    await resp.write_eof()
    return resp


async def healthy(_: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture
def lingering_backend() -> Iterator[str]:
    """A backend on its own thread whose streams end LINGER seconds after [DONE]."""
    port, ready, stop = free_port(), threading.Event(), threading.Event()

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/health", healthy)
        app.router.add_post("/v1/chat/completions", lingering_stream)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.to_thread(stop.wait)
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    try:
        assert ready.wait(10)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(10)


def read_to_done_and_close(base_url: str) -> None:
    host, port = base_url.removeprefix("http://").split(":")
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                         "stream": True})  # fmt: skip
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        seen = b""
        while b"[DONE]" not in seen:
            data = sock.recv(65536)
            assert data, f"connection closed before [DONE]: {seen!r}"
            seen += data


def test_hanging_up_after_done_is_not_a_disconnect(lingering_backend: str, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "gateway.yaml", [lingering_backend])
    with gateway_process("serve", "--config", str(cfg)) as url:
        for _ in range(CALLS):
            read_to_done_and_close(url)
        got = scrape(url)
        for _ in range(100):  # the last call is accounted once its backend stream ends
            if got.total("gateway_requests_total") >= CALLS:
                break
            time.sleep(0.05)
            got = scrape(url)
    assert got.total("gateway_requests_total", status="200") == CALLS
    assert got.total("gateway_client_disconnects_total") == 0
    assert got.total("gateway_tokens_total", kind="completion") == CALLS
