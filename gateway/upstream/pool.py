"""The keep-alive connections to one backend, bounded in number, and a request sent on one.

Idle connections are reused most recent first, so a light load keeps few of them warm; a
connection the backend closed, or idle past ``KEEPALIVE``, is never handed out. At the
limit a request waits for a connection to come back, first come first served.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from gateway.upstream.connection import (
    ConnectError,
    Connection,
    ConnectionBroken,
    Response,
)

KEEPALIVE = 15.0
"""Seconds an idle connection may wait for its next request: a server that closes idle
connections sooner (uvicorn, and so vLLM: 5 s) is seen closing them."""


class Pool:
    """Connections to the backend at ``url`` (http or https, with an optional base path)."""

    def __init__(
        self,
        url: str,
        *,
        headers: Iterable[tuple[str, str]] = (),
        limit: int,
        connect_timeout: float,
        on_connect: Callable[[float], object] | None = None,
    ) -> None:
        """``headers`` go with every request (with ``host``); ``on_connect`` is told how many
        seconds each new connection took to open."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._base = parts.path.rstrip("/")
        self._fixed = header_lines([("host", parts.netloc), *headers])
        self._limit = limit
        self._connect_timeout = connect_timeout
        self._on_connect = on_connect
        self._idle: list[Connection] = []
        self._open = 0
        """Connections open or being opened: at most ``limit``."""
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def request(
        self,
        path: str,
        body: bytes,
        headers: Iterable[tuple[str, str]],
        silence: float,
        method: str = "POST",
    ) -> Response:
        """Send ``body`` (with ``headers`` besides the pool's own) and wait for the answer's
        status and headers, with no silence of the backend over ``silence`` seconds; the
        answer's body is then read from the Response, which must be given back
        (``release`` or ``close``).

        A reused connection the backend closed before answering (its keep-alive timeout
        raced this request) is replaced by a new one, once: the backend never saw the
        request. Raises ConnectError, ConnectionBroken, ProtocolError or TimeoutError.
        """
        head = self._head(method, path, len(body), headers)
        for attempt in range(2):
            conn, reused = await self._acquire()
            resp = conn.send(head, body, silence)
            try:
                await resp.head()
            except ConnectionBroken:
                resp.close()
                if reused and not resp.heard and attempt == 0:
                    continue
                raise
            except BaseException:
                resp.close()
                raise
            return resp
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close every connection; requests still waiting for one fail."""
        self._closed = True
        for conn in self._idle:
            conn.abort()
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionBroken("the upstream client is closed"))

    def _head(
        self, method: str, path: str, length: int, headers: Iterable[tuple[str, str]]
    ) -> bytes:
        start = f"{method} {self._base}{path} HTTP/1.1\r\n".encode("latin-1")
        return b"".join((start, self._fixed, header_lines(headers),
                         b"content-length: %d\r\n\r\n" % length))  # fmt: skip

    async def _acquire(self) -> tuple[Connection, bool]:
        """An idle connection (True: reused) or a new one, waiting at the limit."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise ConnectionBroken("the upstream client is closed")
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed and loop.time() - conn.idle_since < KEEPALIVE:
                    return conn, True
                conn.abort()
            if self._open < self._limit:
                break
            await self._wait_for_room()
        self._open += 1
        try:
            return await self._connect(), False
        except BaseException:
            self._open -= 1
            self._wake_next()
            raise

    async def _wait_for_room(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._wake_next()  # the room it was given goes to the next in line
            raise

    async def _connect(self) -> Connection:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(self._closed_one, self._done_one),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                )
        except OSError as exc:
            raise ConnectError(f"{exc.__class__.__name__}: {exc}") from exc
        if self._on_connect is not None:
            self._on_connect(time.perf_counter() - started)
        return conn

    def _done_one(self, conn: Connection) -> None:
        if self._closed:
            conn.abort()
            return
        self._idle.append(conn)
        self._wake_next()

    def _closed_one(self, conn: Connection) -> None:
        self._open -= 1
        if conn in self._idle:
            self._idle.remove(conn)
        self._wake_next()

    def _wake_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def header_lines(headers: Iterable[tuple[str, str]]) -> bytes:
    """``name: value`` lines; a value that would start a header of its own is refused."""
    lines = []
    for name, value in headers:
        if "\r" in value or "\n" in value:
            raise ValueError(f"header {name} carries a line break")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")
