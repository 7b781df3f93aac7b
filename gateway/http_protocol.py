"""The HTTP server's protocol: uvicorn's httptools protocol, its writes coalesced, and a
way for a streamed answer to write its pieces without an ASGI message each."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

CYCLE = "gateway.cycle"
"""The scope's extension (``{"cycle": ...}``, ASGI's shape) naming the server's own state
for the call (``body_writer``)."""


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
    naming its cycle (``body_writer``)."""

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
    ASGI message each. The response's start and end still go through ASGI's send, so the
    server's account of the response (keep-alive, the next request) stays its own."""

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


def body_writer(scope: Scope) -> BodyWriter | None:
    """A BodyWriter for a response whose start has been sent chunked, where the server is
    ``gateway serve``'s (None under any other, whose writes only ASGI's send can make)."""
    cycle = scope.get("extensions", {}).get(CYCLE, {}).get("cycle")
    if cycle is None or not cycle.chunked_encoding or cycle.response_complete:
        return None
    return BodyWriter(cycle, cycle.transport)
