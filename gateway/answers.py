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

from collections.abc import AsyncIterator, Mapping
from typing import Protocol


class Answer(Protocol):
    """An upstream answer as the pipeline reads it."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; raises GatewayError if the upstream body fails."""
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


class FixedAnswer:
    """A whole body already in hand: a non-streamed answer, or one caller's slice of a
    micro-batched one."""

    __slots__ = ("_body", "headers")

    def __init__(self, body: bytes, headers: Mapping[str, str]) -> None:
        self._body = body
        self.headers = headers

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        """Nothing to give back: the upstream connection was released when read."""

    def close(self) -> None:
        """As release."""
