"""One keep-alive HTTP/1.1 connection to a backend, and the answer read from it.

An asyncio Protocol: the event loop hands it the bytes as they arrive, httptools parses
them (it calls back with the status, each header, each piece of body, the end), and the
reader of the answer is woken only when there is something new for it, and a piped one
(``Response.pipe``) not even then: each read's body is handed to it from the callback.
The body comes as the backend sent it (chunked framing taken off, nothing re-encoded).

Each silence of the backend is bounded while an answer is awaited (``expect``), by one
timer per connection that is re-armed only when it fires: a connection that serves call
after call keeps the timer it has, so a call costs no timer of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import httptools

HIGH_WATER = 256 * 1024
"""Body bytes held unread before the socket stops being read (the backend then waits for
the gateway's slow client, as it would for a client of its own)."""
LOW_WATER = 64 * 1024


class ClientError(Exception):
    """The backend could not be reached or did not answer as HTTP/1.1 says."""


class ConnectError(ClientError):
    """No connection could be opened (refused, unreachable, name unknown)."""


class ConnectionBroken(ClientError):
    """The connection closed or was reset before the answer was whole."""


class ProtocolError(ClientError):
    """Bytes that are not a valid HTTP/1.1 answer (bad status line, headers or chunking)."""


class Response:
    """An answer: status and headers once they came, then its body as it arrives.

    Given back exactly once: ``release`` after reading it to its end (the connection is
    reused), ``close`` otherwise (the connection is closed, so the backend sees the
    request abandoned and aborts it).
    """

    __slots__ = ("_body", "_buffered", "_conn", "_sink", "complete", "error", "headers", "heard",
                 "status")  # fmt: skip

    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn
        self.status = 0
        """0 until the status line and headers have come."""
        self.headers: dict[str, str] = {}
        """Header names in lower case; a repeated header keeps its last value."""
        self.heard = False
        """Any byte of this answer arrived."""
        self.complete = False
        """The whole body arrived."""
        self.error: BaseException | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._sink: Callable[[bytes], bool] | None = None
        """Takes each piece of body as it arrives while piped (``pipe``)."""

    async def head(self) -> None:
        """Wait for the status and headers."""
        while not self.status:
            await self._wait()

    async def chunk(self) -> bytes:
        """All the body that arrived since the last call, once there is some; b"" at
        its end."""
        while True:
            if self._body:
                return self._take()
            if self.complete:
                return b""
            await self._wait()

    async def pipe(self, deliver: Callable[[bytes], bool]) -> bool:
        """Hand each piece of the body to ``deliver`` as it arrives, from the connection's
        own callback: a stream's reader is not woken once per piece (a future, a task step
        and the frames it resumes, each piece costing more than the relay's own work).

        True at the body's end; False once ``deliver`` returned False (its reader takes no
        more for now): the socket is no longer read, and what arrives meanwhile is held
        for the next ``pipe`` or ``chunk``."""
        if self._body and not deliver(self._take()):
            return False
        self._sink = deliver
        if self._conn is not None:
            self._conn.drained()
        try:
            while self._sink is not None and not self.complete:
                await self._wait()
        finally:
            self._sink = None
        if self.error is not None:  # what failed meanwhile, a sink's own exception among it
            raise self.error
        return self.complete and not self._body

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        parts = []
        while chunk := await self.chunk():
            parts.append(chunk)
        return b"".join(parts)

    def expect(self, timeout: float) -> None:
        """From now on, no silence of the backend longer than ``timeout`` seconds."""
        if self._conn is not None:
            self._conn.expect(timeout)

    def release(self) -> None:
        """Give the connection back for another request (closed if the answer is not whole)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.finished(self)

    def close(self) -> None:
        """Close the connection: the backend sees the request abandoned."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()

    async def _wait(self) -> None:
        if self.error is not None:
            raise self.error
        if self._conn is None:
            raise ConnectionBroken("the answer was given back")
        await self._conn.wait()

    def _take(self) -> bytes:
        data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
        if self._buffered > LOW_WATER and self._conn is not None:
            self._conn.drained()
        self._buffered = 0
        return data


class Connection(asyncio.Protocol):
    """A connection's state and httptools' callbacks; one request at a time."""

    def __init__(self, on_close: Callable[[Connection], object],
                 on_done: Callable[[Connection], object]) -> None:  # fmt: skip
        """``on_close`` is told when the connection closes; ``on_done`` when an answer was
        read whole from a connection that can serve another request."""
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._on_close = on_close
        self._on_done = on_done
        self._response: Response | None = None
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._keep_alive = True
        self._timeout = 0.0
        self._heard_at = 0.0
        self._due = 0.0
        """When the armed timer fires (0.0: none armed)."""
        self.closed = False
        self.idle_since = 0.0

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._heard_at = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolError("the backend switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"malformed answer: {exc}"))
        resp = self._response
        if resp is not None and resp._sink is not None and resp._body:
            self._deliver(resp)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self._response
        if resp is not None and not resp.complete and resp.error is None:
            if exc is None and resp.status and until_close(resp.headers):
                resp.complete = True  # a body framed by the end of the connection
            else:
                what = "reset" if exc is not None else "closed"
                resp.error = ConnectionBroken(f"the backend {what} the connection mid-answer")
        self._wake()
        self._on_close(self)

    # httptools' side

    def on_message_begin(self) -> None:
        if self._response is None or self._response.complete:
            raise ProtocolError("an answer to no request")
        self._response.heard = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        raw, self._raw_headers = self._raw_headers, []
        resp = self._response
        if status < 200 or resp is None:  # informational: the answer follows
            return
        resp.headers = {n.decode("latin-1").lower(): v.decode("latin-1") for n, v in raw}
        resp.status = status
        self._wake()

    def on_body(self, body: bytes) -> None:
        resp = self._response
        assert resp is not None
        resp._body.append(body)
        resp._buffered += len(body)
        if resp._sink is not None:  # delivered once the piece read is parsed
            return
        if resp._buffered > HIGH_WATER:
            self._pause()
        self._wake()

    def on_message_complete(self) -> None:
        resp = self._response
        if resp is None or not resp.status:  # the end of an informational answer
            return
        resp.complete = True
        self._keep_alive = self._parser.should_keep_alive()
        self._wake()

    # the pool's and the answer's side

    def send(self, head: bytes, body: bytes, timeout: float) -> Response:
        """Write a request; its answer is awaited with no silence over ``timeout``."""
        assert self._transport is not None
        assert self._response is None
        resp = self._response = Response(self)
        self.expect(timeout)
        self._transport.writelines((head, body))
        return resp

    def expect(self, timeout: float) -> None:
        self._timeout = timeout
        self._heard_at = now = self._loop.time()
        if not self._due or self._due > now + timeout:
            self._arm(now + timeout)

    async def wait(self) -> None:
        """Until something new happened to the answer."""
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _deliver(self, resp: Response) -> None:
        """What a piped answer's read brought, to its sink at once: one piece per read, as
        ``chunk`` takes it (a backend faster than the gateway sends many events per read).
        A sink that takes no more stops the reading and wakes the answer's reader."""
        assert resp._sink is not None
        try:
            taken = resp._sink(resp._take())
        except Exception as exc:  # noqa: BLE001 - the reader's fault: raised to it, never to the loop
            resp._sink, resp.error = None, exc
            self._wake()
            self.abort()
            return
        if not taken:
            resp._sink = None
            self._pause()
            self._wake()

    def _pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def drained(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def finished(self, resp: Response) -> None:
        """The answer's reader is done with it: reuse the connection if it can be."""
        self._response = None
        if resp.complete and self._keep_alive and not self.closed and resp.error is None:
            self.drained()  # its next answer is read from the start
            self.idle_since = self._loop.time()
            self._on_done(self)
        else:
            self.abort()

    def abort(self) -> None:
        """Close at once (no more reading); ``connection_lost`` follows."""
        if self._transport is not None and not self.closed:
            self.closed = True
            self._transport.abort()

    def _fail(self, exc: ClientError) -> None:
        resp = self._response
        if resp is not None and not resp.complete:
            resp.error = exc
        self._wake()
        self.abort()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _arm(self, due: float) -> None:
        self._due = due
        self._loop.call_at(due, self._check_silence, due)

    def _check_silence(self, due: float) -> None:
        """The armed timer fired: fail an answer the backend has kept silent on for too
        long, or arm again for when its current silence would be too long."""
        if due != self._due:  # superseded by an earlier one
            return
        self._due = 0.0
        resp = self._response
        if self.closed or resp is None or resp.complete or resp.error is not None:
            return
        now = self._loop.time()
        if self._paused:  # the silence is the gateway's own slow reader's
            self._arm(now + self._timeout)
        elif now - self._heard_at < self._timeout:
            self._arm(self._heard_at + self._timeout)
        else:
            self._fail_timeout(resp)

    def _fail_timeout(self, resp: Response) -> None:
        resp.error = TimeoutError(f"no byte from the backend in {self._timeout:g} s")
        self._wake()
        self.abort()


def until_close(headers: dict[str, str]) -> bool:
    """A body that ends when the connection does: neither a length nor chunked."""
    return "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")
