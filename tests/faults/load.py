"""A bounded load of app-shaped calls through the official openai client.

Each of ``clients`` workers owns an ``AsyncOpenAI`` client (its own connection pool, no
SDK retries: a failure the gateway lets through must show) and makes calls one after
another, streamed and not in turn, until the scenario (the fault) has played; every
call's outcome, status, duration and call id is recorded. Calls in flight then finish
(each is bounded by the client's timeout), so the load stops by itself.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

from tests.e2e.conftest import MODEL

SYSTEM = (
    "You are a support assistant for a hosting company. Answer briefly, cite the "
    "customer's plan when it matters, and never invent a price. " * 4
)
QUESTIONS = [
    "My site is slow since this morning, what can I check first?",
    "How do I move my database to the larger plan?",
    "Why was I billed twice this month?",
    "Can I keep my domain if I cancel?",
    "What does the 502 on my dashboard mean?",
]


@dataclass(slots=True)
class Outcome:
    """One call as its client saw it."""

    stream: bool
    started: float
    """Seconds since the load began."""
    duration: float
    """Until the whole answer (or the error) arrived."""
    status: int | None
    """HTTP status; None when no response came (connection error, timeout)."""
    request_id: str | None
    """The gateway's id for the call (x-gateway-request-id, else x-request-id)."""
    error: str | None = None
    """Why the call failed, None if it was answered in full."""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Load:
    outcomes: list[Outcome] = field(default_factory=list)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    _recorded: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def record(self, outcome: Outcome) -> None:
        async with self._recorded:
            self.outcomes.append(outcome)
            self._recorded.notify_all()

    async def calls(self, n: int) -> None:
        """Wait until n calls have finished (a fault strikes a load that is running)."""
        async with self._recorded:
            await self._recorded.wait_for(lambda: len(self.outcomes) >= n)

    async def more_calls(self, n: int) -> None:
        await self.calls(len(self.outcomes) + n)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def of(self, stream: bool) -> list[Outcome]:
        return [o for o in self.outcomes if o.stream is stream]

    def max_duration(self) -> float:
        return max(o.duration for o in self.outcomes)

    def summary(self) -> str:
        errors: dict[str, int] = {}
        for o in self.failed:
            errors[f"{o.status}:{o.error}"] = errors.get(f"{o.status}:{o.error}", 0) + 1
        return (
            f"{len(self.outcomes)} calls ({len(self.of(True))} streamed), "
            f"{len(self.failed)} failed {errors}, max {self.max_duration():.2f} s"
        )


Scenario = Callable[[Load], Awaitable[None]]


async def run_load(
    base_url: str,
    api_key: str,
    scenario: Scenario,
    *,
    clients: int = 30,
    limit: float = 120.0,
    call_timeout: float = 30.0,
    think: float = 0.05,
) -> Load:
    """Run `clients` workers while `scenario` plays (the fault); the load ends with it.

    The scenario paces itself by the load's progress (``await load.calls(n)``), not by the
    clock, so a busy machine makes the experiment slower, never different; it must end
    within `limit` seconds, or the load stops and the experiment fails.
    """
    load = Load()
    start = time.monotonic()

    async def worker(n: int) -> None:
        rng = random.Random(n)
        async with openai.AsyncOpenAI(
            base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=call_timeout
        ) as client:
            turn = 0
            while not load.stopped.is_set():
                stream = (n + turn) % 2 == 0
                await load.record(await one_call(client, n, turn, stream, start))
                turn += 1
                await asyncio.sleep(think * rng.random() * 2)

    async def play() -> None:
        try:
            await asyncio.wait_for(scenario(load), limit)
        finally:
            load.stopped.set()

    async with asyncio.TaskGroup() as group:
        for n in range(clients):
            group.create_task(worker(n))
        group.create_task(play())
    return load


def conversation(n: int, turn: int) -> list[ChatCompletionMessageParam]:
    """Client n's conversation at this turn: a shared system prompt and its own history."""
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": SYSTEM}]
    for t in range(turn % 4):
        messages.append({"role": "user", "content": f"[{n}] {QUESTIONS[(n + t) % 5]}"})
        messages.append({"role": "assistant", "content": "Let me check that for you."})
    messages.append({"role": "user", "content": f"[{n}] {QUESTIONS[(n + turn) % 5]}"})
    return messages


async def one_call(
    client: openai.AsyncOpenAI, n: int, turn: int, stream: bool, start: float
) -> Outcome:
    began = time.monotonic()
    status: int | None = None
    request_id: str | None = None
    error: str | None = None
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=conversation(n, turn),
            max_tokens=8,
            stream=stream,
            stream_options={"include_usage": True} if stream else openai.omit,
        )
        status, request_id = raw.status_code, call_id(raw.headers)
        error = await read_answer(raw.parse())
    except openai.APIStatusError as exc:
        status, request_id = exc.status_code, call_id(exc.response.headers)
        error = type(exc).__name__
    except Exception as exc:
        error = type(exc).__name__
    return Outcome(stream, began - start, time.monotonic() - began, status, request_id, error)


def call_id(headers: Mapping[str, str]) -> str | None:
    return headers.get("x-gateway-request-id") or headers.get("x-request-id")


async def read_answer(
    answer: ChatCompletion | openai.AsyncStream[ChatCompletionChunk],
) -> str | None:
    """None if the answer is whole: a completion, or a stream that ended with its usage."""
    if isinstance(answer, ChatCompletion):
        return None if answer.choices and answer.usage else "incomplete answer"
    usage = None
    async for chunk in answer:
        usage = chunk.usage or usage
    return None if usage is not None else "stream ended without usage"
