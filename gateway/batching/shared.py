"""One upstream answer relayed to any number of listeners, each from its first byte.

A pump task reads the upstream answer into a buffer; every listener replays the buffer
and then follows it live, so a call that joins while the stream is in progress still gets
every event from the start. A listener that leaves does not stop the others; when the
last one leaves before the end, the pump closes the upstream response and the backend
aborts the sequence.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

from gateway.answers import Answer, Deliver, pull
from gateway.errors import BadGateway, GatewayError


class SharedAnswer:
    """The buffer and pump behind one shared upstream answer; owns the pump task."""

    def __init__(self, upstream: Answer, on_end: Callable[[SharedAnswer], object]) -> None:
        """``on_end`` runs once the answer is complete, failed or abandoned."""
        self.headers: Mapping[str, str] = upstream.headers
        self._upstream = upstream
        self._chunks: list[bytes] = []
        self._error: GatewayError | None = None
        self._done = False
        self._changed = asyncio.Event()
        self._listeners = 0
        self._complete = False
        self._on_end = on_end
        self._pump = asyncio.get_running_loop().create_task(self._run(), name="shared-answer")
        self._pump.add_done_callback(self._finished)

    def listen(self) -> Listener | None:
        """A new listener from the first byte; None when the answer was abandoned."""
        if self._pump.cancelling() or (self._pump.done() and self._pump.cancelled()):
            return None
        self._listeners += 1
        return Listener(self)

    async def aclose(self) -> None:
        """Stop the pump (gateway shutdown)."""
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)

    async def _run(self) -> None:
        try:
            async for chunk in self._upstream.chunks():
                self._chunks.append(chunk)
                self._wake()
            self._complete = True
        except GatewayError as exc:
            self._error = exc

    def _finished(self, _: asyncio.Task[None]) -> None:
        """Also runs for a pump cancelled before it started, whose body never ran."""
        self._done = True
        self._wake()
        if self._complete:
            self._upstream.release()
        else:
            self._upstream.close()
        self._on_end(self)

    def _wake(self) -> None:
        # Every waiter's wait() resolves on set(); clearing at once re-arms the event.
        self._changed.set()
        self._changed.clear()

    def _leave(self) -> None:
        self._listeners -= 1
        if self._listeners == 0 and not self._done:
            self._pump.cancel()


class Listener:
    """One call's view of a shared answer (an Answer)."""

    def __init__(self, shared: SharedAnswer) -> None:
        self._shared = shared
        self._left = False
        self._piped: AsyncIterator[bytes] | None = None

    @property
    def headers(self) -> Mapping[str, str]:
        return self._shared.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        """Everything so far in one piece, then each chunk as it comes."""
        shared, seen = self._shared, 0
        while True:
            if seen < len(shared._chunks):
                pending = shared._chunks[seen:]
                seen += len(pending)
                yield b"".join(pending)
                continue
            if shared._done:
                if shared._error is not None:
                    raise shared._error
                if shared._pump.cancelled():
                    raise BadGateway("the shared upstream call was cancelled")
                return
            await shared._changed.wait()

    async def pipe(self, deliver: Deliver) -> bool:
        if self._piped is None:
            self._piped = self.chunks()
        return await pull(self._piped, deliver)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def release(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening (idempotent); the last listener to leave ends the upstream call."""
        if not self._left:
            self._left = True
            self._shared._leave()
