"""Micro-batching: concurrent embeddings calls go upstream as one list request.

A call that finds no upstream call of its kind (same model, same options) in flight is
sent at once: batching never delays an idle gateway. Otherwise calls are collected into
one list request (at most ``embeddings_max_batch`` inputs) that goes when an upstream
call of the group returns or ``embeddings_window`` has passed, whichever comes first.
Each caller gets its own slice of the answer, indices renumbered from 0, and its share
of the usage. A batch the backend refuses as a bad request is re-sent call by call, so
one caller's bad input never fails the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from gateway.answers import Answer, FixedAnswer, read_whole
from gateway.backends import Backend
from gateway.batching.coalesce import own_copy
from gateway.errors import BadGateway, GatewayError, UpstreamError
from gateway.flow import Call
from gateway.settings import BatchingSettings

Send = Callable[[Call, bytes, str | None], Awaitable[tuple[Backend, Answer]]]


@dataclass(slots=True)
class Outcome:
    """A caller's answer (unread, or its slice of the batch's), or the error to raise."""

    backend: Backend | None = None
    answer: Answer | None = None
    error: GatewayError | None = None


@dataclass(eq=False, slots=True)
class Member:
    call: Call
    payload: bytes
    inputs: list[str]
    outcome: asyncio.Future[Outcome]


@dataclass(eq=False, slots=True)
class Batch:
    body: dict[str, Any]
    """The first caller's body, model renamed for upstream; `input` is filled at send."""
    members: list[Member] = field(default_factory=list)
    size: int = 0
    full: asyncio.Event = field(default_factory=asyncio.Event)


class EmbeddingBatcher:
    """Open batches by model and options; owns the task that sends each batch."""

    def __init__(self, settings: BatchingSettings) -> None:
        self._window = settings.embeddings_window
        self._max = settings.embeddings_max_batch
        self._open: dict[bytes, Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._busy: Counter[bytes] = Counter()
        """Upstream calls in flight per group: a call that finds none is sent at once."""

    async def submit(
        self, call: Call, upstream_model: str, payload: bytes, send: Send
    ) -> tuple[Backend, Answer]:
        assert call.request is not None
        body = call.request.body
        inputs = text_inputs(body.get("input"))
        if inputs is None or len(inputs) >= self._max:
            return await send(call, payload, None)
        key = group_key(body)
        batch = self._open.get(key)
        if batch is None and not self._busy[key]:
            with self._sending(key):  # nothing to wait for: no window, no added latency
                return await send(call, payload, None)
        if batch is not None and batch.size + len(inputs) > self._max:
            self._seal(key, batch)
            batch = None
        if batch is None:
            batch = self._open[key] = Batch(body={**body, "model": upstream_model})
            task = asyncio.get_running_loop().create_task(self._run(key, batch, send))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        member = Member(call, payload, inputs, asyncio.get_running_loop().create_future())
        batch.members.append(member)
        batch.size += len(inputs)
        if batch.size >= self._max:
            self._seal(key, batch)
        # shield: a caller that gives up must not cancel the others' upstream call.
        outcome = await asyncio.shield(member.outcome)
        if outcome.error is not None:
            raise own_copy(outcome.error)
        assert outcome.backend is not None
        assert outcome.answer is not None
        return outcome.backend, outcome.answer

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @contextlib.contextmanager
    def _sending(self, key: bytes) -> Iterator[None]:
        """Count an upstream call of the group in flight while the block runs.

        When it returns, the group's open batch goes at once rather than at the end of its
        window: the wait was for company, and company arrives only while calls are in
        flight, so a fast backend is never kept waiting on the window.
        """
        self._busy[key] += 1
        try:
            yield
        finally:
            self._busy[key] -= 1
            if not self._busy[key]:
                del self._busy[key]
            if (batch := self._open.get(key)) is not None:
                self._seal(key, batch)

    def _seal(self, key: bytes, batch: Batch) -> None:
        """No more members: send now."""
        if self._open.get(key) is batch:
            del self._open[key]
        batch.full.set()

    async def _run(self, key: bytes, batch: Batch, send: Send) -> None:
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(batch.full.wait(), self._window)
            self._seal(key, batch)
            with self._sending(key):
                if len(batch.members) == 1:
                    await self._alone(batch.members[0], send)
                else:
                    await self._together(batch, send)
        finally:
            # Cancelled at shutdown, or failed unexpectedly: nobody may wait forever.
            self._seal(key, batch)
            fail(batch.members, BadGateway("the batched upstream call failed"))

    async def _alone(self, member: Member, send: Send) -> None:
        """The member's own request, answered as if it had never waited for company."""
        try:
            backend, upstream = await send(member.call, member.payload, None)
        except GatewayError as exc:
            member.outcome.set_result(Outcome(error=exc))
            return
        member.outcome.set_result(Outcome(backend=backend, answer=upstream))

    async def _together(self, batch: Batch, send: Send) -> None:
        members, leader = batch.members, batch.members[0].call
        body = {k: v for k, v in batch.body.items() if k != "user"}
        body["input"] = [text for m in members for text in m.inputs]
        try:
            backend, upstream = await send(leader, orjson.dumps(body), None)
            raw = await read_whole(upstream)
            parts = split_response(
                raw, [len(m.inputs) for m in members], [weight(m.inputs) for m in members]
            )
        except UpstreamError as exc:
            if 400 <= exc.status < 500 and exc.status != 429:
                # A bad input fails the whole list: let each call get its own answer.
                await asyncio.gather(*(self._alone(m, send) for m in members))
            else:
                fail(members, exc)
            return
        except GatewayError as exc:
            fail(members, exc)
            return
        headers = upstream.headers
        for m, part in zip(members, parts, strict=True):
            if m.call is not leader:
                m.call.route = replace(leader.route) if leader.route else None
                m.call.dispatched_at = leader.dispatched_at or time.perf_counter()
                m.call.served_by = "batched"
            m.outcome.set_result(Outcome(backend=backend, answer=FixedAnswer(part, headers)))


def fail(members: list[Member], error: GatewayError) -> None:
    """Answer every member not yet answered with the error."""
    for m in members:
        if not m.outcome.done():
            m.outcome.set_result(Outcome(error=error))


def text_inputs(raw: Any) -> list[str] | None:
    """The call's input strings; None for token-id inputs, which are sent on their own."""
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        return raw
    return None


def group_key(body: Mapping[str, Any]) -> bytes:
    """Calls batch together when everything but their inputs (and `user`) is the same."""
    rest = {k: v for k, v in body.items() if k not in ("input", "user")}
    return hashlib.blake2b(orjson.dumps(rest, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()


def weight(inputs: list[str]) -> int:
    """A caller's share of the batch's tokens, by its inputs' length (vLLM reports no
    per-input token counts)."""
    return sum(len(text) for text in inputs)


def largest_remainder(total: int, weights: list[int]) -> list[int]:
    """Split an integer in proportion to weights; the parts sum to it exactly.

    Floors first, then one more each to the largest remainders (earlier parts win ties).
    Zero weights all round: an equal split.
    """
    if not weights:
        return []
    if sum(weights) <= 0:
        weights = [1] * len(weights)
    whole = sum(weights)
    parts = [total * w // whole for w in weights]
    order = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % whole), i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def split_response(raw: bytes, sizes: list[int], weights: list[int]) -> list[bytes]:
    """Cut one list answer into each caller's answer, in order: its vectors, indices
    from 0, and its share of every usage count."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadGateway("backend sent an unreadable embeddings answer") from exc
    items = data.get("data") if isinstance(data, dict) else None
    if (
        not isinstance(items, list)
        or len(items) != sum(sizes)
        or not all(isinstance(item, dict) for item in items)
    ):
        raise BadGateway("backend's embeddings answer does not match the inputs sent")
    items = sorted(items, key=lambda item: item.get("index", 0))
    usage = data.get("usage")
    shares = usage_shares(usage, weights) if isinstance(usage, dict) else None
    out, start = [], 0
    for i, n in enumerate(sizes):
        part = dict(data)
        part["data"] = [{**item, "index": j} for j, item in enumerate(items[start : start + n])]
        if shares is not None:
            part["usage"] = shares[i]
        out.append(orjson.dumps(part))
        start += n
    return out


def usage_shares(usage: Mapping[str, Any], weights: list[int]) -> list[dict[str, Any]]:
    """Each caller's usage object: the integer counts split, anything else kept."""
    shares = [dict(usage) for _ in weights]
    for name, value in usage.items():
        if isinstance(value, int) and not isinstance(value, bool):
            for share, part in zip(shares, largest_remainder(value, weights), strict=True):
                share[name] = part
    return shares
