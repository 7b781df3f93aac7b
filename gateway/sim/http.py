"""A small HTTP/1.1 server on asyncio and httptools, for the simulator's hot path.

Why not aiohttp: its own per-request work caps even an empty handler below what
`--instant` must serve with real work to do; a protocol over httptools serves several
times as many requests on the same cores.
The simulator needs only what this offers: keep-alive, pipelined requests answered in
order, Content-Length or chunked request bodies, chunked streaming responses with flow
control, and cancellation of a request's handler when its client disconnects.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import cast

import httptools

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: bytes = b"application/json"


@dataclass(eq=False, slots=True)
class Request:
    method: str
    path: str
    body: bytes
    keep_alive: bool
    conn: Connection = field(repr=False)

    def stream(self, content_type: bytes = b"text/event-stream") -> Stream:
        """Start a chunked 200 response; the handler then returns None."""
        conn = self.conn
        conn.transport.write(
            conn.head(200, content_type, b"transfer-encoding: chunked\r\n", self.keep_alive)
        )
        return Stream(self)


class Stream:
    """The body of a streamed response, written chunk by chunk with back-pressure."""

    def __init__(self, request: Request) -> None:
        self._request = request

    async def write(self, data: bytes) -> None:
        conn = self._request.conn
        conn.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        await conn.drain()

    def end(self) -> None:
        conn = self._request.conn
        conn.transport.write(b"0\r\n\r\n")
        conn.end_response()
        if not self._request.keep_alive:
            conn.transport.close()


Result = Response | Awaitable[Response | None]
Dispatch = Callable[[Request], Result]
"""Answers a request: at once with a Response, or with an awaitable that streams or
returns one later (it runs as the connection's task and is cancelled on disconnect)."""


class Connection(asyncio.Protocol):
    """One client connection: parse requests, answer them in order."""

    def __init__(self, dispatch: Dispatch, headers: bytes, live: set[Connection]) -> None:
        self._dispatch = dispatch
        self._headers = headers
        self._live = live
        self._queue: deque[Request] = deque()
        self._url = b""
        self._body: list[bytes] = []
        self._size = 0
        self._closed = False
        self._paused = False
        self._responding = False
        """A response has begun and not ended: an error can only hang up."""
        self._drained: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self._second = 0
        self._date = b""
        """The Date header, rendered once a second (as uvicorn does), not per response."""

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Streamed tokens are small writes: Nagle would hold each one back until the
            # client's delayed ACK (~40 ms) on a reused connection.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._parser = httptools.HttpRequestParser(self)
        self._live.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._refuse(400)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._live.discard(self)
        if self.task is not None:
            self.task.cancel()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url, self._body, self._size = b"", [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"expect" and value.lower() == b"100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > MAX_BODY:
            self._refuse(413)
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._closed:
            return
        path = httptools.parse_url(self._url).path.decode("latin-1")
        method = self._parser.get_method().decode("latin-1")
        keep_alive = self._parser.should_keep_alive()
        self._queue.append(Request(method, path, b"".join(self._body), keep_alive, self))
        if self.task is None:
            self._next()

    # -- answering --------------------------------------------------------------------

    def _next(self) -> None:
        while self._queue and self.task is None and not self._closed:
            request = self._queue.popleft()
            try:
                result = self._dispatch(request)
            except Exception:  # a server must answer, and log what broke
                log.exception("handler failed for %s %s", request.method, request.path)
                self._refuse(500)
                return
            if isinstance(result, Response):
                self.send(request, result)
            else:
                self.task = asyncio.get_running_loop().create_task(self._finish(request, result))

    async def _finish(self, request: Request, pending: Awaitable[Response | None]) -> None:
        try:
            response = await pending
        except ConnectionError:  # the client left mid-stream: nothing to answer
            self.transport.close()
            return
        except Exception:  # a server must answer, and log what broke
            log.exception("handler failed for %s %s", request.method, request.path)
            self._refuse(500)
            return
        if response is not None:
            self.send(request, response)
        self.task = None
        self._next()

    def head(self, status: int, content_type: bytes, extra: bytes, keep_alive: bool) -> bytes:
        """The status line and headers of the current request's response."""
        self._responding = True
        phrase = HTTPStatus(status).phrase.encode()
        close = b"" if keep_alive else b"connection: close\r\n"
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._date = b"date: %b\r\n" % formatdate(now, usegmt=True).encode()
        return b"HTTP/1.1 %d %b\r\ncontent-type: %b\r\n%b%b%b%b\r\n" % (
            status,
            phrase,
            content_type,
            extra,
            self._date,
            self._headers,
            close,
        )

    def send(self, request: Request, response: Response) -> None:
        if self._closed:
            return
        length = b"content-length: %d\r\n" % len(response.body)
        head = self.head(response.status, response.content_type, length, request.keep_alive)
        self.transport.write(head + response.body)
        self._responding = False
        if not request.keep_alive:
            self.transport.close()

    def end_response(self) -> None:
        self._responding = False

    async def drain(self) -> None:
        if self._closed:
            raise ConnectionResetError("client disconnected")
        if self._paused:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def _refuse(self, status: int) -> None:
        """Answer a request the server cannot handle (unless its answer began), hang up."""
        if not self._closed:
            if not self._responding:
                body = b'{"detail":"%b"}' % HTTPStatus(status).phrase.encode()
                length = b"content-length: %d\r\n" % len(body)
                self.transport.write(self.head(status, b"application/json", length, False) + body)
            self.transport.close()
        self._closed = True


def headers_block(pairs: Iterable[tuple[str, str]]) -> bytes:
    """Extra response headers, rendered once for every response."""
    return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in pairs)
