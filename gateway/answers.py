"""What an upstream answer is, to everything after the send: the relay, the body reader and
the batch stage, which hands one upstream answer to several calls.

An answer is read through ``chunks()`` (or whole through ``read()``) and then given back:
``release()`` once it was read to its end (the connection can be reused), ``close()``
otherwise (the backend sees the call abandoned and aborts it). A failure of the upstream
body while it is read is already a GatewayError (BadGateway, GatewayTimeout): the HTTP
client's own exceptions stay behind the sending stage, so a shared, split or watched answer
reads exactly as one that came straight from the backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

Deliver = Callable[[bytes], bool]
"""Takes a piece of an answer's body; False when it takes no more for now (``pipe``)."""


class Answer(Protocol):
    """An upstream answer as the pipeline reads it."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; raises GatewayError if the upstream body fails."""
        ...

    async def pipe(self, deliver: Deliver) -> bool:
        """The body's bytes handed to ``deliver`` as they arrive, without a wake of the
        reader per piece where the answer can (an upstream stream's own): True at the end;
        False as soon as ``deliver`` returned False (it takes no more for now), the rest
        kept for the next ``pipe``. Raises as ``chunks``."""
        ...

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        ...

    def release(self) -> object: ...

    def close(self) -> None: ...


async def read_whole(answer: Answer) -> bytes:
    """The answer's body, whole; its connection given back either way."""
    try:
        return await answer.read()
    finally:
        answer.release()


async def pull(chunks: AsyncIterator[bytes], deliver: Deliver) -> bool:
    """``pipe`` for an answer read piece by piece: ``chunks`` is one iterator kept across
    calls, so a ``pipe`` that stopped goes on where it stopped."""
    async for chunk in chunks:
        if not deliver(chunk):
            return False
    return True


class FixedAnswer:
    """A whole body already in hand: a non-streamed answer, or one caller's slice of a
    micro-batched one."""

    __slots__ = ("_body", "headers")

    def __init__(self, body: bytes, headers: Mapping[str, str]) -> None:
        self._body = body
        self.headers = headers

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def pipe(self, deliver: Deliver) -> bool:
        deliver(self._body)
        return True  # all of it delivered, taken or not

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        """Nothing to give back: the upstream connection was released when read."""

    def close(self) -> None:
        """As release."""
