"""Relay a streamed answer to the client as it arrives: an ASGI response.

Starlette's StreamingResponse notices a disconnect only when a write fails, which may be
long after the client left (during a slow prefill, or never if writes are silently
dropped). Here a watcher waits for ``http.disconnect`` and closes the upstream answer at
once, so vLLM aborts the sequence and frees its KV blocks. A client that hangs up once it
has the last event (``[DONE]``, a Responses stream's ``response.completed``) had the whole
answer: that is no disconnect.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.answers import Answer
from gateway.errors import GatewayError
from gateway.flow import Call
from gateway.stages.sse import EventScanner


class StreamRelay(Response):
    """Relays an upstream answer's SSE events through an EventScanner to the client.

    When it returns, ``call.done_at`` is set and the upstream answer given back (released
    if complete, otherwise closed so the backend aborts); what the scanner found is read
    by the pipeline's end.
    """

    def __init__(
        self,
        call: Call,
        upstream: Answer,
        scanner: EventScanner,
        raw_headers: list[tuple[bytes, bytes]],
    ) -> None:
        """``raw_headers``: encoded, the content type among them."""
        self.call = call
        self.upstream = upstream
        self.scanner = scanner
        self.status_code = 200
        self.background = None
        self.answered = False
        """The client has been sent the stream's last event."""
        self.raw_headers = raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        complete = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self._relay():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            complete = not self.call.disconnected
        except OSError:
            self.call.disconnected = not self.answered
            complete = self.answered
        finally:
            watcher.cancel()
            # A finished answer leaves a reusable connection; anything else must be cut so
            # the backend sees the client leave.
            if complete:
                self.upstream.release()
            else:
                self.upstream.close()
            self.call.done_at = time.perf_counter()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self.answered:
            self.call.disconnected = True
            self.upstream.close()

    async def _relay(self) -> AsyncIterator[bytes]:
        call, scanner = self.call, self.scanner
        try:
            async for data in self.upstream.chunks():
                out = scanner.feed(data)
                if call.first_byte_at is None and scanner.token_seen:
                    call.first_byte_at = time.perf_counter()
                if out:
                    if call.events is not None:
                        call.events += out.count(b"\n") >> 1
                    self.answered = scanner.ended
                    yield out
        except GatewayError as exc:
            if not call.disconnected:
                # Headers are sent: all that is left is to end the stream visibly.
                call.status, call.error_type = exc.status, exc.type
                yield b"data: " + exc.json() + b"\n\n"
            return
        tail = scanner.tail()
        if tail.strip():
            yield tail
