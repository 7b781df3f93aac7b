"""Backends on loopback that misbehave on purpose: raw TCP servers speaking just enough
HTTP/1.1 to answer (or not) the gateway's real upstream client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

SSE = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)
JSON = b'{"choices":[{"index":0,"message":{"content":"hi"}}],"usage":{"prompt_tokens":3}}'


@dataclass
class Backend:
    """One server: how it behaves, and what it saw."""

    behaviour: str
    """ok, hang, reset, or an HTTP status to answer with (e.g. "500")."""
    url: str = ""
    requests: int = 0
    received: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a request has arrived whole: the backend holds a call."""
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the gateway closed a connection that was waiting for its answer: what
    makes vLLM abort the request."""
    metrics: bytes = b""
    """What GET /metrics answers, as vLLM's Prometheus text."""
    scrapes: list[float] = field(default_factory=list)
    """When each GET /metrics arrived (monotonic)."""
    connections: int = 0
    """Connections opened to it."""


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(request line, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n")
         if line.lower().startswith(b"content-length:")),
        0,
    )  # fmt: skip
    return head.partition(b"\r\n")[0], await reader.readexactly(length)


def response(status: int, body: bytes, content_type: bytes) -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        content_type,
        len(body),
        body,
    )


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def model(urls: list[str]) -> dict[str, object]:
    """Model "m" served by these backends, named b0, b1, ... in order."""
    return {"name": "m", "backends": [{"url": u, "name": f"b{i}"} for i, u in enumerate(urls)]}


def handler(backend: Backend) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend.connections += 1
        try:
            while True:
                line, body = await read_request(reader)
                if line.startswith(b"GET /metrics"):
                    backend.scrapes.append(time.monotonic())
                    writer.write(response(200, backend.metrics, b"text/plain"))
                    await writer.drain()
                    continue
                backend.requests += 1
                backend.received.set()
                if backend.behaviour == "hang":
                    await reader.read()  # returns at EOF: the client gave up on us
                    backend.closed.set()
                    return
                if backend.behaviour == "reset":
                    return
                if backend.behaviour.isdigit():
                    err = b'{"error":{"message":"no","type":"x","param":null,"code":null}}'
                    writer.write(response(int(backend.behaviour), err, b"application/json"))
                elif b'"stream":true' in body:
                    writer.write(response(200, SSE, b"text/event-stream"))
                else:
                    writer.write(response(200, JSON, b"application/json"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    return handle


@asynccontextmanager
async def backends(*behaviours: str) -> AsyncIterator[list[Backend]]:
    """Start one server per behaviour on a free loopback port."""
    started = [Backend(b) for b in behaviours]
    servers = []
    for b in started:
        server = await asyncio.start_server(handler(b), "127.0.0.1", 0)
        b.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        servers.append(server)
    try:
        yield started
    finally:
        for server in servers:
            server.close()
