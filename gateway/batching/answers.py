"""Answers that stand in for an upstream HTTP response when calls share one upstream call.

The relay and the body reader use only this much of aiohttp's ClientResponse: its
headers, ``content.iter_any()``, ``read()``, ``release()`` and ``close()``. A shared,
split or watched answer offers the same, so the rest of the pipeline cannot tell a call
that rode on another's upstream call from one that made its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol


class Chunks(Protocol):
    def iter_any(self) -> AsyncIterator[bytes]: ...


class Answer(Protocol):
    """What the pipeline reads an upstream answer through (aiohttp's ClientResponse fits)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> Chunks: ...

    async def read(self) -> bytes: ...

    def release(self) -> object: ...

    def close(self) -> None: ...


class FixedAnswer:
    """A whole body already in hand: one caller's slice of a micro-batched answer."""

    def __init__(self, body: bytes, headers: Mapping[str, str]) -> None:
        self._body = body
        self.headers = headers

    @property
    def content(self) -> FixedAnswer:
        return self

    async def iter_any(self) -> AsyncIterator[bytes]:
        yield self._body

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        """Nothing to give back: the upstream connection was released when read."""

    def close(self) -> None:
        """As release."""
