"""A scripted OpenAI-style SSE server on a real loopback socket, recording what it got.

It lets the client and runner tests check exact bytes and timing-independent facts
(history sent back, headers, counts) that the simulator would only show indirectly.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class FakeBackend:
    base_url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    delay: float = 0.0
    """Seconds between content chunks."""


FAKE = web.AppKey("fake", FakeBackend)


async def _chat(request: web.Request) -> web.StreamResponse:
    fake: FakeBackend = request.app[FAKE]
    body = await request.json()
    fake.received.append(body)
    fake.headers.append(dict(request.headers))
    mode = request.match_info["mode"]
    if mode == "fail":
        return web.json_response({"error": {"message": "busy"}}, status=503)
    if mode == "junk":
        return web.Response(body=b'data: {"choices": "oops"}\n\n', content_type="text/event-stream")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    if mode == "ok":
        resp.headers["x-backend-instance"] = "fake-1"
    await resp.prepare(request)
    n = len(fake.received)
    await resp.write(
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    )
    for i in range(body["max_tokens"]):
        await asyncio.sleep(fake.delay)
        chunk = {"choices": [{"index": 0, "delta": {"content": f"a{n}.{i} "}}]}
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    if mode == "cut":
        return resp
    words = sum(len(m["content"].split()) for m in body["messages"])
    usage = {
        "prompt_tokens": words,
        "completion_tokens": body["max_tokens"],
        "prompt_tokens_details": {"cached_tokens": words // 2},
    }
    await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})


@asynccontextmanager
async def fake_backend() -> AsyncIterator[FakeBackend]:
    """Serves /{ok,noheader,fail,cut,junk}/v1/...; base_url points at /ok/v1."""
    fake = FakeBackend()
    app = web.Application()
    app[FAKE] = fake
    app.router.add_post("/{mode}/v1/chat/completions", _chat)
    app.router.add_get("/{mode}/v1/models", _models)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    fake.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/ok/v1"
    try:
        yield fake
    finally:
        await runner.cleanup()
        sock.close()
