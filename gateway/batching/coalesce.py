"""Coalescing: identical deterministic calls in flight together share one upstream call.

The first call (the leader) is sent as usual; an identical call arriving while the
leader's answer is still on its way joins it and gets the same answer: a whole body once
it is read, a stream from its first byte. Each caller keeps its own request id, ledger
row and usage-chunk preference.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import orjson

from gateway.answers import Answer, FixedAnswer, read_whole
from gateway.backends import Backend
from gateway.batching.shared import SharedAnswer
from gateway.errors import BadGateway, GatewayError
from gateway.flow import Call, Request, Route

Forward = Callable[[Call, bytes], Awaitable[tuple[Backend, Answer]]]

IGNORED_FIELDS = frozenset({"stream", "stream_options", "user"})
"""Fields that do not change the answer's content: streaming is keyed separately, the
gateway always asks upstream for usage, and `user` only names the end user."""


def coalesce_key(request: Request) -> bytes | None:
    """A digest naming the answer, for a call whose answer is fixed by its body; else None.

    Only greedy, single-choice calls qualify (temperature 0, n = 1): sampled answers
    must differ between calls.
    """
    if not request.deterministic or request.endpoint == "embeddings":
        return None
    body = {k: v for k, v in request.body.items() if k not in IGNORED_FIELDS}
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    tag = f"{request.endpoint}:{int(request.stream)}:".encode()
    return hashlib.blake2b(tag + canonical, digest_size=16).digest()


@dataclass(slots=True)
class Sent:
    """How the leader's call went: its backend and answer, or its error."""

    backend: Backend | None = None
    route: Route | None = None
    whole: FixedAnswer | None = None
    """A non-streamed answer, read once and handed to every caller."""
    stream: SharedAnswer | None = None
    """A streamed answer, relayed to each caller from its first byte."""
    error: GatewayError | None = None


class Coalescer:
    """Calls in flight by coalescing key; owns every shared stream's pump."""

    def __init__(self) -> None:
        self._flights: dict[bytes, asyncio.Future[Sent]] = {}
        self._streams: set[SharedAnswer] = set()

    async def submit(
        self, call: Call, key: bytes, payload: bytes, forward: Forward
    ) -> tuple[Backend, Answer]:
        while (flight := self._flights.get(key)) is not None:
            # shield: a follower that gives up must not cancel the leader's call.
            sent = await asyncio.shield(flight)
            if sent.error is not None:
                raise own_copy(sent.error)
            answer = sent.whole or (sent.stream.listen() if sent.stream else None)
            if answer is not None:
                assert sent.backend is not None
                call.route = replace(sent.route) if sent.route else None
                call.dispatched_at = time.perf_counter()
                call.served_by = "coalesced"
                return sent.backend, answer
            if self._flights.get(key) is flight:
                del self._flights[key]  # abandoned by its leader or listeners: start afresh
        return await self._lead(call, key, payload, forward)

    async def _lead(
        self, call: Call, key: bytes, payload: bytes, forward: Forward
    ) -> tuple[Backend, Answer]:
        assert call.request is not None
        flight: asyncio.Future[Sent] = asyncio.get_running_loop().create_future()
        self._flights[key] = flight
        try:
            backend, upstream = await forward(call, payload)
            if not call.request.stream:
                raw = await read_whole(upstream)
        except GatewayError as exc:
            self._land(key, flight, Sent(error=exc))
            raise
        except asyncio.CancelledError:
            # The leader's client left: the followers still want the answer, and the next
            # of them leads anew.
            self._land(key, flight, Sent())
            raise
        except BaseException:
            self._land(key, flight, Sent(error=BadGateway("the shared upstream call failed")))
            raise
        if not call.request.stream:
            whole = FixedAnswer(raw, upstream.headers)
            self._land(key, flight, Sent(backend=backend, route=call.route, whole=whole))
            return backend, whole
        stream = SharedAnswer(upstream, on_end=lambda a: self._ended(key, flight, a))
        self._streams.add(stream)
        listener = stream.listen()
        assert listener is not None
        flight.set_result(Sent(backend=backend, route=call.route, stream=stream))
        return backend, listener

    def _land(self, key: bytes, flight: asyncio.Future[Sent], sent: Sent) -> None:
        flight.set_result(sent)
        if self._flights.get(key) is flight:
            del self._flights[key]

    def _ended(self, key: bytes, flight: asyncio.Future[Sent], stream: SharedAnswer) -> None:
        self._streams.discard(stream)
        if self._flights.get(key) is flight:
            del self._flights[key]

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in list(self._streams)))


def own_copy(exc: GatewayError) -> GatewayError:
    """The same error for another caller: its headers get that caller's own request id."""
    clone = exc.__class__.__new__(exc.__class__)
    clone.__dict__.update(exc.__dict__)
    clone.args = exc.args
    clone.headers = dict(exc.headers)
    return clone
