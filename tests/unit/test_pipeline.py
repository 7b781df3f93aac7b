"""``handle`` through a fake Services: the order of a call's way and of its end.

Real stages, backend pool, index, batch stage and in-memory limiter; fakes only at the
seams the pipeline reaches out through (key ring, upstream client, ledger), which record
what they were handed and in what order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from decimal import Decimal
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from starlette.responses import Response
from starlette.types import Message

from gateway import pipeline
from gateway.answers import Answer, FixedAnswer
from gateway.backends import Backend, BackendPool
from gateway.batching import Batcher
from gateway.errors import BadGateway, GatewayError, InvalidRequest, UpstreamError
from gateway.flow import Call, Cost, Principal, Usage
from gateway.index.memory import MemoryIndex
from gateway.limits import LimitMetrics
from gateway.limits.base import Plan
from gateway.limits.memory import MemoryLimiter
from gateway.metrics import GatewayMetrics
from gateway.services import Services
from gateway.settings import load_settings
from gateway.stages.limits import Plans
from gateway.stages.prefix import PrefixHasher
from gateway.stages.routing import make_policy
from tests.unit import loopback
from tests.unit.batching.fakes import FakeUpstream
from tests.unit.test_access import finished_call

PRINCIPAL = Principal(key_id="k1", team="t1", rpm=1000, tpm=10**7, budget_usd=Decimal(100))
PROMPT = "the same long system prompt, word after word, " * 8
ANSWER = orjson.dumps(
    {
        "choices": [{"index": 0, "message": {"content": "an answer"}}],
        "usage": {"prompt_tokens": 90, "completion_tokens": 3},
    }
)
EVENTS = (
    b'data: {"choices":[{"index":0,"delta":{"content":"an answer"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":90,"completion_tokens":3,'
    b'"prompt_tokens_details":{"cached_tokens":64}}}\n\n'
    b"data: [DONE]\n\n"
)


class Keys:
    """The key ring's seam: every caller is one known key with limits."""

    def known(self, authorization: str | None) -> Principal:
        return PRINCIPAL

    async def authenticate(self, authorization: str | None) -> Principal:
        return PRINCIPAL


class Upstream:
    """The upstream client's seam: hands out the given answers (or raises the given
    errors) in turn, as Upstream.send does once an answer begins."""

    def __init__(self, answers: list[Answer | GatewayError]) -> None:
        self.answers = answers

    def watch(self, call: Call, receive: object) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    async def send(self, call: Call, backend: Backend, body: bytes) -> Answer:
        answer = self.answers.pop(0)
        if isinstance(answer, GatewayError):
            raise answer
        assert call.request is not None
        if call.request.stream:
            call.first_byte_at = time.perf_counter()
        return answer


class Ledger:
    """The ledger's seam: prices a call by its completion tokens and keeps each row."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps
        self.rows: list[tuple[Call, Cost]] = []

    def price(self, call: Call) -> Cost:
        self.steps.append("price")
        tokens = call.usage.completion_tokens if call.usage else 0
        return Cost(output=tokens * 1000, total=tokens * 1000)

    def record(self, call: Call, cost: Cost) -> None:
        self.steps.append("ledger")
        self.rows.append((call, cost))


class Limiter(MemoryLimiter):
    """The in-memory limiter, keeping the spend each settle added."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(LimitMetrics(CollectorRegistry()))
        self.steps = steps
        self.spent: list[int] = []

    def settle(self, plan: Plan, tokens: int, units: int) -> None:
        self.steps.append("settle")
        self.spent.append(units)
        super().settle(plan, tokens, units)


class AccessLog:
    """The access log's seam: notes each line among the steps of the call's end."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    def write(self, call: Call) -> None:
        self.steps.append("access")


@pytest.fixture
def steps() -> list[str]:
    return []


def services(steps: list[str], *answers: Answer | GatewayError) -> Any:
    settings = load_settings(models=[loopback.model(["http://127.0.0.1:9"])])
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    return Services(
        settings=settings,
        registry=registry,
        metrics=metrics,
        backends=BackendPool(settings.models, settings.upstream, metrics),
        # Fakes for the concrete clients Services names (it holds no Protocols for them).
        upstream=Upstream(list(answers)),  # type: ignore[arg-type]
        prefix=PrefixHasher(settings.prefix),
        index=MemoryIndex(settings.routing, settings.prefix),
        policy=make_policy(settings.routing),
        ledger=Ledger(steps),  # type: ignore[arg-type]
        keys=Keys(),  # type: ignore[arg-type]
        limits=Limiter(steps),
        plans=Plans(),
        batching=Batcher(settings.batching),
        access=AccessLog(steps),  # type: ignore[arg-type]
        started_at=0.0,
    )


def new_call() -> Call:
    return Call(id="r1", path="/v1/chat/completions", headers={"authorization": "Bearer k"})


def body(stream: bool = False, **extra: object) -> bytes:
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "hi"}]
    return orjson.dumps({"model": "m", "messages": messages, "stream": stream, **extra})


async def never_leaves() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def handle(svc: Any, raw: bytes) -> Response:
    return await pipeline.handle(new_call(), raw, "chat", svc, never_leaves)


async def relay(response: Response) -> bytes:
    """Run a response as the server would, then the turn its sends go out in (the call's
    end is queued behind them); the bytes the client got."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await response({"type": "http"}, never_leaves, send)
    await asyncio.sleep(0)
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


END = ["price", "ledger", "settle", "access"]
"""The steps of a call's end these seams see, in order."""


async def test_a_whole_answer_ends_in_order_and_every_step_reads_the_same_price(
    steps: list[str],
) -> None:
    svc = services(steps, FixedAnswer(ANSWER, {"x-backend-instance": "sim-1"}))
    response = await handle(svc, body())
    assert (response.status_code, response.body) == (200, ANSWER)
    assert response.headers["x-gateway-backend"] == "b0"
    assert response.headers["x-backend-instance"] == "sim-1"
    assert steps == []  # the client does not wait for the accounting
    seen_at_send: list[list[str]] = []

    async def send(message: Message) -> None:
        seen_at_send.append(list(steps))

    await response({"type": "http"}, never_leaves, send)
    assert seen_at_send == [[], []]
    assert steps == []  # queued behind the server's send
    await asyncio.sleep(0)
    assert steps == END
    [(call, cost)] = svc.ledger.rows
    assert call.usage == Usage(prompt_tokens=90, completion_tokens=3)
    assert call.cost is cost
    assert svc.limits.spent == [cost.total] == [3000]
    assert call.reply == "an answer"
    assert svc.backends.backends["b0"].in_flight == 0


async def test_a_stream_ends_only_after_its_relay_with_what_the_scanner_found(
    steps: list[str],
) -> None:
    svc = services(steps, FakeUpstream(EVENTS))
    response = await handle(svc, body(stream=True))
    assert steps == []  # nothing is accounted for before the client has the stream
    assert svc.backends.backends["b0"].in_flight == 1
    relayed = await relay(response)
    assert b'"usage"' not in relayed  # the client did not ask for it
    assert relayed.endswith(b"data: [DONE]\n\n")
    assert steps == END
    [(call, cost)] = svc.ledger.rows
    assert call.usage == Usage(prompt_tokens=90, cached_tokens=64, completion_tokens=3)
    assert call.reply == "an answer"
    assert call.events is None  # no slots known at its backend: nothing awaits its end
    assert svc.limits.spent == [cost.total] == [3000]
    assert svc.backends.backends["b0"].in_flight == 0


async def test_a_stream_to_a_backend_whose_slots_run_out_counts_its_events(
    steps: list[str],
) -> None:
    svc = services(steps, FakeUpstream(EVENTS))
    svc.backends.backends["b0"].backlog.slots = 8
    await relay(await handle(svc, body(stream=True)))
    [(call, _)] = svc.ledger.rows
    assert call.events == 2  # the answer's event and [DONE]: the usage event was dropped


async def test_a_stream_keeps_its_usage_event_for_a_client_that_asked(steps: list[str]) -> None:
    svc = services(steps, FakeUpstream(EVENTS))
    options = {"include_usage": True}
    relayed = await relay(await handle(svc, body(stream=True, stream_options=options)))
    assert relayed == EVENTS


async def test_a_stream_that_breaks_off_is_counted_by_the_gateway_and_against_the_backend(
    steps: list[str],
) -> None:
    broken = FakeUpstream()
    broken.queue.put_nowait(b'data: {"choices":[{"index":0,"delta":{"content":"half"}}]}\n\n')
    broken.queue.put_nowait(BadGateway("backend b0 broke off its answer"))
    svc = services(steps, broken)
    relayed = await relay(await handle(svc, body(stream=True)))
    assert b"broke off its answer" in relayed.rsplit(b"\n\n", 2)[-2]
    assert steps == END
    [(call, _)] = svc.ledger.rows
    assert (call.status, call.error_type) == (502, "bad_gateway")
    assert call.usage is not None
    assert call.usage.estimated
    assert call.usage.completion_tokens == 1  # "half", counted by the gateway
    assert call.prefix is not None
    assert call.usage.prompt_tokens == call.prefix.tokens
    backend = svc.backends.backends["b0"]
    assert (backend.in_flight, backend.failures) == (0, 1)


@pytest.mark.parametrize("prompt", [PROMPT, "hi"])
async def test_a_long_stream_that_breaks_off_is_estimated_whole_whether_or_not_it_was_read(
    steps: list[str], prompt: str
) -> None:
    """A reply the index learns from (a prompt it knows) is read whole; one it does not
    (a prompt shorter than a block) passes unread but for its last events, and the count
    of those scales to the whole by their share of the stream."""
    broken = FakeUpstream()
    event = b'data: {"choices":[{"index":0,"delta":{"content":" word"}}]}\n\n'
    for _ in range(2000):
        broken.queue.put_nowait(event)
    broken.queue.put_nowait(BadGateway("backend b0 broke off its answer"))
    svc = services(steps, broken)
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}],
                        "stream": True})  # fmt: skip
    await relay(await handle(svc, raw))
    [(call, _)] = svc.ledger.rows
    assert call.usage is not None
    assert call.usage.estimated
    assert call.usage.completion_tokens == 2000  # " word" is one token
    assert (call.reply_share == 1.0) == (prompt == PROMPT)


async def test_a_backend_error_is_raised_and_accounted_once_without_usage(
    steps: list[str],
) -> None:
    error = UpstreamError(400, b'{"error":{"message":"no","type":"invalid_request_error"}}')
    svc = services(steps, error)
    with pytest.raises(UpstreamError) as raised:
        await handle(svc, body())
    assert raised.value.headers["x-gateway-request-id"] == "r1"
    assert steps == END
    [(call, cost)] = svc.ledger.rows
    assert (call.status, call.usage, cost.total) == (400, None, 0)
    assert svc.backends.backends["b0"].in_flight == 0


async def test_a_call_refused_at_parse_reaches_no_backend_and_is_accounted(
    steps: list[str],
) -> None:
    svc = services(steps)
    with pytest.raises(InvalidRequest):
        await handle(svc, b'{"model": "m"}')
    assert steps == ["price", "ledger", "access"]  # admitted by no limit: nothing to settle
    [(call, _)] = svc.ledger.rows
    assert (call.status, call.route, call.usage) == (400, None, None)


def test_overhead_of_a_stream_is_the_time_before_dispatch() -> None:
    call = finished_call(stream=True)
    assert pipeline.overhead(call) == pytest.approx(0.002)


def test_overhead_of_a_whole_body_adds_the_time_after_it_arrived() -> None:
    call = finished_call(stream=False)
    call.done_at = time.perf_counter() - 0.01
    assert 0.012 <= (pipeline.overhead(call) or 0) < 0.5
    call.dispatched_at = None
    assert pipeline.overhead(call) is None
    assert pipeline.milliseconds(0.0012341) == "1.234"
