"""The HTTP server's protocol: uvicorn's httptools protocol, its writes coalesced."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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
    """uvicorn's httptools protocol over a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
