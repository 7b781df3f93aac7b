"""The HTTP server's protocol: uvicorn's httptools protocol, its writes coalesced, and a
way for an answer to be written without ASGI's send: a whole one in one write, a streamed
one's headers and then its pieces as they come."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

CYCLE = "gateway.cycle"
"""The scope's extension (``{"cycle": ...}``, ASGI's shape) naming the server's own state
for the call (``send_whole``, ``start_chunked``)."""


class CoalescingTransport:
    """A connection's transport whose writes made in one turn of the event loop leave as
    one send.

    uvicorn writes a response's head and each body message separately, and asyncio sends
    each write at once when nothing is queued: a small answer costs two sends, a stream
    one more for its head and one for its end. A send over loopback or a LAN costs far
    more than its bytes (the receiver is woken each time), so what is written in one turn
    is joined and sent at the end of the turn. Everything else is the transport's own;
    closing sends what is pending first."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def write_now(self, data: bytes) -> None:
        """Send at once, after what is pending: a piece of a stream relayed as it is read,
        which nothing else will join in its turn (a call_soon and a handle less)."""
        if self._pending:
            self._pending.append(data)
            self._flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol over a :class:`CoalescingTransport`, each call's scope
    naming its cycle (``send_whole``, ``start_chunked``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:
            self.scope.setdefault("extensions", {})[CYCLE] = {"cycle": cycle}


class BodyWriter:
    """Writes a streamed answer's pieces to the client's connection as HTTP/1.1 chunks, from
    wherever they come (the upstream connection's own callback), instead of as an awaited
    ASGI message each. The response's end still goes through ASGI's send, so the server's
    account of the response (keep-alive, the next request) stays its own."""

    __slots__ = ("_cycle", "_transport")

    def __init__(self, cycle: RequestResponseCycle, transport: CoalescingTransport) -> None:
        self._cycle = cycle
        self._transport = transport

    def write(self, data: bytes) -> None:
        """One piece; nothing once the client is gone."""
        if not self._cycle.disconnected:
            self._transport.write_now(b"%x\r\n%b\r\n" % (len(data), data))

    @property
    def paused(self) -> bool:
        """The client's connection holds more unsent than it should: stop writing."""
        return self._cycle.flow.write_paused

    async def drain(self) -> None:
        """Until the client has taken enough for writing to go on (or has gone)."""
        await self._cycle.flow.drain()


def send_whole(scope: Scope, head: list[tuple[bytes, bytes]], body: bytes | memoryview) -> bool:
    """Send a whole 200 answer (its headers, without content-length, and its body) as one
    write, where the server is ``gateway serve``'s; False (nothing sent) under any other,
    or to a client that reads too slowly to take more (ASGI's send waits for it)."""
    cycle = writable(scope)
    if cycle is None:
        return False
    content = status_and_headers(cycle, head)
    content.append(b"content-length: %d\r\n\r\n" % len(body))
    cycle.transport.write(b"".join((*content, body)))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
    return True


def start_chunked(scope: Scope, head: list[tuple[bytes, bytes]]) -> BodyWriter | None:
    """Send a 200 answer's headers for a body in chunks, and return the writer of its
    pieces, where the server is ``gateway serve``'s; None (nothing sent) as send_whole.
    The body's end goes through ASGI's send, which completes the server's account."""
    cycle = writable(scope)
    if cycle is None:
        return None
    content = status_and_headers(cycle, head)
    content.append(b"transfer-encoding: chunked\r\n\r\n")
    cycle.chunked_encoding = True
    cycle.expected_content_length = 0
    cycle.transport.write(b"".join(content))
    return BodyWriter(cycle, cast(CoalescingTransport, cycle.transport))  # the protocol's own


def writable(scope: Scope) -> RequestResponseCycle | None:
    """The server's state for the call, where the answer can be written without ASGI's
    send: under ``gateway serve``, before anything of it is sent, to a client still there
    and taking what it is sent.

    ASGI's send makes every call pay for generality: an awaited message for the start and
    one for the body, a regular-expression check of each header (these are the gateway's
    own, and the backend's as its parser read them) and a pass over the headers for a
    framing the gateway already knows."""
    cycle: RequestResponseCycle | None = scope.get("extensions", {}).get(CYCLE, {}).get("cycle")
    if cycle is None or cycle.response_started or cycle.disconnected or cycle.flow.write_paused:
        return None
    return cycle


def status_and_headers(cycle: RequestResponseCycle, head: list[tuple[bytes, bytes]]) -> list[bytes]:
    """A 200 answer's status line and headers, the server's own (``date``) first, without
    the framing header or the blank line; the response is started from here on."""
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    content = [b"HTTP/1.1 200 OK\r\n"]
    for name, value in (*cycle.default_headers, *head):
        content += (name, b": ", value, b"\r\n")
    if not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    return content
