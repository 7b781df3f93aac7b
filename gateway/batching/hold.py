"""Cold-prefix hold: calls sharing a long prefix that no backend holds wait for one leader.

Sent together to a cold backend, N calls with the same long prefix each prefill it: N
times the work, and every one of them waits for all of it. Held instead, the first call
(the leader) prefills the prefix alone; the others follow it to the same backend once
its first generated token shows the prefix is computed, and find it cached. The wait is
bounded: on timeout, or if the leader fails, they are routed as usual.

A leader is whichever call comes first, before routing knows whether any backend holds
its prefix. Once it is routed to one that does (an agent's system prompt, cached
everywhere), nobody waits for it: a warm prefix has nothing to share, and holding every
call behind the first token of the one before it would queue them all in the gateway.
Only calls arriving while the leader is being routed (its index lookup) wait for it then.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from gateway.answers import Answer, Deliver
from gateway.backends import Backend
from gateway.errors import BackendUnavailable
from gateway.flow import Call, Decision
from gateway.settings import BatchingSettings
from gateway.stages.sse import carries_token

Send = Callable[[Call, bytes, str | None], Awaitable[tuple[Backend, Answer]]]
"""Route and send a call; the third argument pins it to one backend by name."""

COLD: frozenset[Decision] = frozenset({"miss", "affinity", "fallback"})
"""Routing decisions that mean no backend was found holding the prefix."""


@dataclass(slots=True)
class Leader:
    call: Call
    released: asyncio.Future[str | None]
    """Its backend's name once its first token arrived; None if it failed first."""
    hashes: list[int]
    """Its prompt's block hashes: how much of it a follower shares."""
    deadline: float
    """Loop time after which nobody waits for it and the next call leads anew:
    hold_max_wait bounds the hold as a whole, so a leader that never answers cannot tax
    every later call with the same prefix."""

    @property
    def warm(self) -> bool:
        """Routed to a backend that holds its prefix: nothing to wait for."""
        route = self.call.route
        return route is not None and route.decision not in COLD


class PrefixHold:
    """Leaders in flight by prefix; each holds a future its followers wait on."""

    def __init__(self, settings: BatchingSettings) -> None:
        self._settings = settings
        self._leaders: dict[tuple[str, int], Leader] = {}

    def key(self, call: Call) -> tuple[str, int] | None:
        """The model and the hash naming the call's first ``hold_min_tokens`` tokens."""
        prefix, request = call.prefix, call.request
        if prefix is None or request is None:
            return None
        blocks = -(-self._settings.hold_min_tokens // prefix.block_size)
        if blocks < 1 or len(prefix.hashes) < blocks:
            return None
        return request.model, prefix.hashes[blocks - 1]

    async def submit(self, call: Call, payload: bytes, send: Send) -> tuple[Backend, Answer]:
        key = self.key(call)
        if key is None:
            return await send(call, payload, None)
        leader = self._leaders.get(key)
        if leader is not None and leader.deadline > asyncio.get_running_loop().time():
            if leader.warm or not self._worth_waiting(call, leader):
                return await send(call, payload, None)
            backend = await self._wait(leader)
            if backend is not None:
                call.served_by = "held"
                try:
                    return await send(call, payload, backend)
                except BackendUnavailable:
                    call.served_by = "upstream"  # the leader's backend went away: route anew
            return await send(call, payload, None)
        return await self._lead(call, key, payload, send)

    def _worth_waiting(self, call: Call, leader: Leader) -> bool:
        """Only when the leader's prompt covers enough of this one (hold_min_share).

        A call that shares just an opening (a system prompt before its own long document)
        would wait for the leader's whole prefill to save a small part of its own, and
        following the leader would undo the routing policy's spreading of such calls.
        """
        assert call.prefix is not None
        key = call.prefix
        common = shared_blocks(key.hashes, leader.hashes) * key.block_size
        return min(common, key.tokens) >= self._settings.hold_min_share * key.tokens

    async def _wait(self, leader: Leader) -> str | None:
        """The leader's backend once its prefix is computed; None after the deadline."""
        left = leader.deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(asyncio.shield(leader.released), left)
        except TimeoutError:
            return None

    async def _lead(
        self, call: Call, key: tuple[str, int], payload: bytes, send: Send
    ) -> tuple[Backend, Answer]:
        loop = asyncio.get_running_loop()
        assert call.prefix is not None
        deadline = loop.time() + self._settings.hold_max_wait
        leader = Leader(call, loop.create_future(), call.prefix.hashes, deadline)
        self._leaders[key] = leader

        def release(backend: str | None) -> None:
            if not leader.released.done():
                leader.released.set_result(backend)
            if self._leaders.get(key) is leader:
                del self._leaders[key]

        try:
            backend, upstream = await send(call, payload, None)
        except BaseException:
            release(None)
            raise
        if call.route is None or call.route.decision not in COLD:
            release(None)  # warm already: the others route to it as usual
            return backend, upstream
        return backend, TokenWatch(upstream, lambda ok: release(backend.name if ok else None))


def shared_blocks(a: list[int], b: list[int]) -> int:
    """Leading blocks two prompts share: their chained hashes agree up to there."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


class TokenWatch:
    """The leader's answer, passed through unchanged, watched for its first token.

    ``signal(True)`` once a generated token (or the complete answer) arrives, which
    shows the prompt was prefilled; ``signal(False)`` if the answer fails or is dropped
    first. Called once.
    """

    def __init__(self, upstream: Answer, signal: Callable[[bool], None]) -> None:
        self._upstream = upstream
        self._signal: Callable[[bool], None] | None = signal
        self._finder = FirstToken()

    @property
    def headers(self) -> Mapping[str, str]:
        return self._upstream.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        complete = False
        try:
            async for chunk in self._upstream.chunks():
                if self._signal is not None and self._finder.feed(chunk):
                    self._fire(True)
                yield chunk
            complete = True
        finally:
            self._fire(complete)

    async def pipe(self, deliver: Deliver) -> bool:
        def watched(chunk: bytes) -> bool:
            if self._signal is not None and self._finder.feed(chunk):
                self._fire(True)
            return deliver(chunk)

        try:
            complete = await self._upstream.pipe(watched)
        except BaseException:
            self._fire(False)
            raise
        if complete:
            self._fire(True)
        return complete

    async def read(self) -> bytes:
        complete = False
        try:
            body = await self._upstream.read()
            complete = True
            return body
        finally:
            self._fire(complete)

    def release(self) -> object:
        self._fire(False)
        return self._upstream.release()

    def close(self) -> None:
        self._fire(False)
        self._upstream.close()

    def _fire(self, ok: bool) -> None:
        if self._signal is not None:
            signal, self._signal = self._signal, None
            signal(ok)


class FirstToken:
    """Finds the first SSE event of a stream that carries generated output.

    A chat stream may open with an empty role-only delta before the prompt is prefilled
    (the simulator does), so the first byte alone does not show a computed prefix.
    """

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> bool:
        self._buf += chunk
        *events, self._buf = self._buf.split(b"\n\n")
        return any(carries_token(e) for e in events)
