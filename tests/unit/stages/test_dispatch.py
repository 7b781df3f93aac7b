"""Slow and dead backends: a call that has sent nothing to its client yet moves to another
backend, bounded; its client leaving cuts the wait. The gateway's real upstream client
against misbehaving servers on loopback (tests/unit/loopback.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from starlette.types import Message

from gateway.backends import BackendPool
from gateway.errors import ClientClosedRequest, GatewayTimeout, UpstreamError
from gateway.flow import Call, Request
from gateway.metrics import GatewayMetrics
from gateway.settings import load_settings
from gateway.stages.dispatch import accuracy, dispatch
from gateway.stages.forward import Upstream
from tests.unit import loopback


class NoIndex:
    healthy = True

    def record(self, model: str, backend: str, hashes: object) -> None:
        pass


@asynccontextmanager
async def gateway(urls: list[str], **upstream: Any) -> AsyncIterator[Any]:
    """The services dispatch uses: a real pool and upstream client, no probes running."""
    settings = load_settings(
        models=[loopback.model(urls)],
        upstream={"first_byte_timeout": 0.3, "read_timeout": 30, **upstream},
    )
    metrics = GatewayMetrics(CollectorRegistry())
    client = Upstream(settings.upstream, metrics)
    await client.start()
    try:
        yield SimpleNamespace(
            backends=BackendPool(settings.models, settings.upstream, metrics),
            index=NoIndex(),
            upstream=client,
            metrics=metrics,
            settings=settings,
        )
    finally:
        await client.aclose()


def call(stream: bool) -> Call:
    """A call without a prefix: routed to the least loaded backend, the first on a tie."""
    c = Call(id="r1", path="/v1/chat/completions")
    body = {"model": "m", "messages": [], "stream": stream}
    c.request = Request(endpoint="chat", model="m", body=body, stream=stream)
    return c


def payload(stream: bool) -> bytes:
    return b'{"model":"m","stream":true}' if stream else b'{"model":"m"}'


def retries(svc: Any) -> float:
    value: float = svc.metrics.retries.labels("m")._value.get()
    return value


def in_flight(svc: Any) -> list[int]:
    return [b.in_flight for b in svc.backends.backends.values()]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_backend_silent_past_its_timeout_is_left_for_another(stream: bool) -> None:
    timeouts = {"first_byte_timeout": 0.3} if stream else {"read_timeout": 0.3}
    async with (
        loopback.backends("hang", "ok") as (hung, ok),
        gateway([hung.url, ok.url], **timeouts) as svc,
    ):
        c = call(stream)
        backend, answer = await dispatch(c, svc.backends.model("m"), payload(stream), svc)
        body = await answer.read()
        await asyncio.wait_for(hung.closed.wait(), 5)  # the hung request was abandoned
    assert backend.name == "b1"
    assert body == (loopback.SSE if stream else loopback.JSON)
    assert retries(svc) == 1
    assert in_flight(svc) == [0, 1]  # the answered call stays counted until it finishes
    assert svc.backends.backends["b0"].failures == 1


async def test_ejection_cuts_the_waits_of_its_calls_at_once() -> None:
    """A non-streamed answer may legitimately take minutes; a hung backend is found by the
    breaker (here: an ejection as a failed probe makes it), and its waiting calls move."""
    async with loopback.backends("hang", "ok") as (hung, ok), gateway([hung.url, ok.url]) as svc:
        pool = svc.backends
        sent = asyncio.create_task(dispatch(call(False), pool.model("m"), payload(False), svc))
        await hung.received.wait()
        pool.eject(pool.backends["b0"], "probe")
        backend, answer = await asyncio.wait_for(sent, 5)
        await asyncio.wait_for(hung.closed.wait(), 5)
    assert backend.name == "b1"
    assert await answer.read() == loopback.JSON
    assert retries(svc) == 1
    assert pool.backends["b0"].circuit == "open"


@pytest.mark.parametrize("behaviour", ["reset", "500", "503"])
async def test_reset_and_5xx_before_any_byte_are_retried(behaviour: str) -> None:
    async with loopback.backends(behaviour, "ok") as (bad, ok), gateway([bad.url, ok.url]) as svc:
        backend, _ = await dispatch(call(True), svc.backends.model("m"), payload(True), svc)
    assert (backend.name, bad.requests, ok.requests) == ("b1", 1, 1)
    assert retries(svc) == 1


async def test_a_backend_4xx_is_the_calls_own_and_is_not_retried() -> None:
    async with loopback.backends("400", "ok") as (bad, ok), gateway([bad.url, ok.url]) as svc:
        with pytest.raises(UpstreamError) as info:
            await dispatch(call(False), svc.backends.model("m"), payload(False), svc)
    assert info.value.status == 400
    assert (bad.requests, ok.requests) == (1, 0)
    assert retries(svc) == 0
    assert svc.backends.backends["b0"].failures == 0


@pytest.mark.parametrize("retry_budget", [0, 1, 2])
async def test_retries_are_bounded_and_leave_no_load_behind(retry_budget: int) -> None:
    async with (
        loopback.backends("hang", "hang", "hang") as hung,
        gateway([h.url for h in hung], retries=retry_budget) as svc,
    ):
        with pytest.raises(GatewayTimeout):
            await dispatch(call(True), svc.backends.model("m"), payload(True), svc)
        for h in hung[: retry_budget + 1]:
            await asyncio.wait_for(h.closed.wait(), 5)
    assert [h.requests for h in hung] == [1] * (retry_budget + 1) + [0] * (2 - retry_budget)
    assert retries(svc) == retry_budget
    assert in_flight(svc) == [0, 0, 0]


class Client:
    """An ASGI receive for a client whose whole body was read: the next message is the
    disconnect, when the test says so."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.watched = asyncio.Event()
        self.receives = 0

    async def receive(self) -> Message:
        self.receives += 1
        self.watched.set()
        await self.gone.wait()
        return {"type": "http.disconnect"}


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_leaving_before_its_answer_began_aborts_the_upstream_call(
    stream: bool,
) -> None:
    async with (
        loopback.backends("hang", "ok") as (hung, ok),
        gateway([hung.url, ok.url], first_byte_timeout=30) as svc,
    ):
        c, client = call(stream), Client()

        async def wait() -> None:
            with svc.upstream.watch(c, client.receive):
                await dispatch(c, svc.backends.model("m"), payload(stream), svc)

        waiting = asyncio.create_task(wait())
        await hung.received.wait()
        await client.watched.wait()  # the watcher starts once the wait is not short
        client.gone.set()
        with pytest.raises(ClientClosedRequest):
            await asyncio.wait_for(waiting, 5)
        await asyncio.wait_for(hung.closed.wait(), 5)
    assert c.disconnected
    assert ok.requests == 0  # not retried: nobody wants the answer
    assert retries(svc) == 0
    assert in_flight(svc) == [0, 0]
    assert svc.backends.backends["b0"].failures == 0


async def test_a_prompt_answer_never_starts_a_watcher() -> None:
    async with loopback.backends("ok") as (ok,), gateway([ok.url]) as svc:
        c, client = call(False), Client()
        with svc.upstream.watch(c, client.receive):
            await dispatch(c, svc.backends.model("m"), payload(False), svc)
        await asyncio.sleep(0.6)  # past two sweeps, had it been left among the waiting
    assert client.receives == 0
    assert not c.disconnected


async def test_an_ejection_leaves_the_waits_alone_when_no_other_backend_can_take_them() -> None:
    async with loopback.backends("hang") as (hung,), gateway([hung.url]) as svc:
        pool = svc.backends
        sent = asyncio.create_task(dispatch(call(False), pool.model("m"), payload(False), svc))
        await hung.received.wait()
        pool.eject(pool.backends["b0"], "probe")
        await asyncio.sleep(0.1)
        assert not sent.done()  # still waiting: its backend may yet answer
        assert pool.backends["b0"].waits
        sent.cancel()
        await asyncio.gather(sent, return_exceptions=True)


@pytest.mark.parametrize(
    ("predicted", "reported", "outcome"),
    [
        (0.9, 0.85, "accurate"),
        (0.0, 0.1, "accurate"),
        (0.9, 0.5, "over"),
        (0.0, 0.6, "under"),
    ],
)
def test_prediction_accuracy_compares_shares(
    predicted: float, reported: float, outcome: str
) -> None:
    assert accuracy(predicted, reported) == outcome
