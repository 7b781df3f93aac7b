"""Relay a streamed answer to the client as it arrives: an ASGI response.

Starlette's StreamingResponse notices a disconnect only when a write fails, which may be
long after the client left (during a slow prefill, or never if writes are silently
dropped). Here a watcher waits for ``http.disconnect`` and closes the upstream answer at
once, so vLLM aborts the sequence and frees its KV blocks. A client that hangs up once it
has the last event (``[DONE]``, a Responses stream's ``response.completed``) had the whole
answer: that is no disconnect.

Under ``gateway serve`` the events go from the upstream connection's callback straight to
the client's (``_push``): a stream from a real backend comes a token or two per read, and
waking a task and sending an ASGI message for each cost more than scanning and writing
it. Under any other server, each piece goes as an ASGI message (``_relay``).
"""

from __future__ import annotations

import asyncio
import time

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway.answers import Answer
from gateway.errors import GatewayError
from gateway.flow import Call
from gateway.http_protocol import BodyWriter, start_chunked
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
            writer = start_chunked(scope, self.raw_headers)
            if writer is None:
                start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                await send(start)
                await self._relay(send)
            else:
                await self._push(writer, send)
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

    async def _relay(self, send: Send) -> None:
        """Each piece of the answer, scanned, on to the client as an ASGI message."""
        try:
            async for data in self.upstream.chunks():
                if out := self._scan(data):
                    await send(more(out))
        except GatewayError as exc:
            await self._failed(exc, send)
            return
        if (tail := self.scanner.tail()).strip():
            await send(more(tail))

    async def _push(self, writer: BodyWriter, send: Send) -> None:
        """Each piece of the answer, scanned, written to the client from the upstream
        connection's own callback (``Answer.pipe``): a piece costs no wake of this task,
        no ASGI message. While the client's connection holds too much unsent, the
        upstream is not read."""

        def deliver(data: bytes) -> bool:
            if out := self._scan(data):
                writer.write(out)
            return not writer.paused

        try:
            while not await self.upstream.pipe(deliver):
                await writer.drain()
        except GatewayError as exc:
            await self._failed(exc, send)
            return
        if (tail := self.scanner.tail()).strip():
            writer.write(tail)

    def _scan(self, data: bytes) -> bytes:
        """What of ``data`` goes to the client (whole events), noting what the call's end
        and the slot forecast read: the first token, the events passed, the last event."""
        call, scanner = self.call, self.scanner
        out = scanner.feed(data)
        if call.first_byte_at is None and scanner.token_seen:
            call.first_byte_at = time.perf_counter()
        if out:
            if call.events is not None:
                call.events += out.count(b"\n") >> 1
            self.answered = scanner.ended
        return out

    async def _failed(self, exc: GatewayError, send: Send) -> None:
        """The upstream failed mid-stream: headers are out, so all that is left is to end
        the stream visibly with the error as its last event."""
        if not self.call.disconnected:
            self.call.status, self.call.error_type = exc.status, exc.type
            await send(more(b"data: " + exc.json() + b"\n\n"))


def more(chunk: bytes) -> Message:
    """A piece of the stream's body, more to follow."""
    return {"type": "http.response.body", "body": chunk, "more_body": True}
