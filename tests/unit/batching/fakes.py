"""Fakes at the batch stage's seams: an upstream answer fed by the test, and a `send`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gateway.answers import Deliver, pull
from gateway.backends import Backend
from gateway.errors import GatewayError
from gateway.flow import Call, Decision, PrefixKey, Request, Route


class FakeUpstream:
    """An upstream answer whose chunks the test feeds one by one (the Answer protocol)."""

    def __init__(self, body: bytes | None = None) -> None:
        self.headers = {"x-backend-instance": "b1"}
        self.queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        if body is not None:
            self.queue.put_nowait(body)
            self.queue.put_nowait(None)
        self.closed = False
        self.released = False
        self._piped: AsyncIterator[bytes] | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        while (item := await self.queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    async def pipe(self, deliver: Deliver) -> bool:
        if self._piped is None:
            self._piped = self.chunks()
        return await pull(self._piped, deliver)

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeSend:
    """Routes every call to one backend with a fixed decision, and records what it sent.

    ``answers`` gives each sent call's upstream (in order); once they run out, each call
    gets a complete answer. ``errors`` raise instead, in order, before any answer.
    """

    decision: Decision = "miss"
    answers: list[FakeUpstream] = field(default_factory=list)
    errors: list[GatewayError] = field(default_factory=list)
    gates: list[asyncio.Event] = field(default_factory=list)
    """The first calls wait for these, in order, before answering: a slow backend."""
    sent: list[tuple[Call, bytes, str | None]] = field(default_factory=list)

    async def __call__(
        self, call: Call, payload: bytes, pin: str | None
    ) -> tuple[Backend, FakeUpstream]:
        self.sent.append((call, payload, pin))
        error = self.errors.pop(0) if self.errors else None
        answer = self.answers.pop(0) if self.answers else FakeUpstream(b"answer")
        name = pin or "b1"
        # Routed first, then the wait for the backend's first chunk, as dispatch does.
        call.route = Route(backend=name, decision=self.decision)
        if self.gates:
            await self.gates.pop(0).wait()
        await asyncio.sleep(0)
        if error is not None:
            raise error
        call.dispatched_at = 1.0
        return Backend(name=name, url="http://" + name), answer


def chat_call(hashes: list[int] | None = None, **body: object) -> Call:
    call = Call(id=f"c{id(body)}", path="/v1/chat/completions")
    call.request = Request(
        "chat",
        "m",
        dict(body),
        stream=body.get("stream") is True,
        deterministic=body.get("temperature") == 0,
    )
    if hashes is not None:
        call.prefix = PrefixKey(tokens=len(hashes) * 16, hashes=hashes, block_size=16)
    return call


def embeddings_call(inputs: str | list[str]) -> Call:
    call = Call(id=f"e{id(inputs)}", path="/v1/embeddings")
    call.request = Request("embeddings", "m", {"model": "m", "input": inputs})
    return call
