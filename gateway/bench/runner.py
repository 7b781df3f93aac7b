"""Replay a seeded workload against one or more targets: ``run`` and ``compare``.

Usage from Python (both are coroutines)::

    from gateway.bench import runner, workloads
    from gateway.bench.client import Target

    opts = runner.Options(concurrency=8, requests=200, seed=1)
    report = await runner.run(workloads.SharedPrefix(), Target(url), opts)
    reports = await runner.compare(workloads.MultiTurn(), [Target(a, "rr"), Target(b, "cache")])

Why compare gives every target its own copy of the stream, all running at once: on a
shared, noisy 2-core machine the noise (another process, a GC pause, CPU throttling)
changes from second to second. Targets measured one after the other see different noise;
targets measured at the same time see the same noise, so their ratio cancels most of it.
Alternating requests between targets would also share the noise, but would split the
workload so each target sees only half the requests and a different cache history.
Hence each target is a *lane* with its own pooled client, its own conversation
histories and the full seeded request stream. Open loop (``rate``): one seeded Poisson
clock dispatches request i to every lane at the same instant, rotating which lane goes
first so none gets a systematic head start. Closed loop (``concurrency``): each lane has
C workers. With ``isolate`` (the default), lane k's prompts start with a short tag
"[Tk]" of the same length for every lane, so targets that share backends (gateway vs
direct to the same simulator) cannot warm each other's prefix cache.

Ordering: requests are taken in the workload's order; a multi-turn turn waits for the
previous turn of its conversation to finish and then carries its actual answer. The
first N requests are thus the same set in every run, whatever the timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.bench.client import Sample, Target, first_model, open_session, stream_chat
from gateway.bench.progress import Progress
from gateway.bench.report import Report, RunInfo, summarize
from gateway.bench.workloads import Tiny, Turn, Workload

DEFAULT_CONCURRENCY = 8
OPEN_LOOP_CONNECTIONS = 1000
"""Pool size per target at a Poisson rate, where in-flight requests are not bounded."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    """How to run a workload. Give concurrency or rate (neither: concurrency 8)."""

    model: str | None = None
    """None: the first model the first target lists at /models."""
    seed: int = 0
    concurrency: int | None = None
    rate: float | None = None
    """Poisson arrivals per second (open loop)."""
    bursts: Bursts | None = None
    """Open loop: windows in which the arrival rate is multiplied (see Bursts)."""
    requests: int | None = None
    duration: float | None = None
    """Stop dispatching after this many seconds (in-flight requests finish)."""
    warmup: int = 0
    """Unmeasured tiny requests per target first: connections and code paths get warm."""
    timeout: float = 120.0
    session_header: bool = False
    """Send each conversation's id as x-session-id."""
    ignore_eos: bool = True
    """Ask vLLM for exactly max_tokens tokens, so output lengths repeat run to run."""
    salt: str = ""
    """Prepended to every first message: repeat a run against a warm server without hits."""
    progress: bool = False
    steady_after: int = 0
    """Report also the figures without the first N requests sent (Report.steady): the
    first sight of every prefix is a cold prefill whatever the router does."""

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.rate is not None:
            raise ValueError("give concurrency or rate, not both")
        if (self.concurrency or 1) < 1 or (self.rate is not None and self.rate <= 0):
            raise ValueError("concurrency and rate must be positive")

    @property
    def workers(self) -> int:
        return self.concurrency or DEFAULT_CONCURRENCY

    @property
    def load(self) -> str:
        return f"rate={self.rate:g}/s" if self.rate else f"concurrency={self.workers}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Bursts:
    """A rate schedule: the arrival rate times ``factor`` for ``length`` seconds, every
    ``every`` seconds, the first burst starting at ``start`` (seconds into the run)."""

    start: float = 10.0
    every: float = 20.0
    length: float = 10.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (self.start >= 0 and self.every >= self.length > 0 and self.factor >= 1):
            raise ValueError("bursts need start >= 0, every >= length > 0 and factor >= 1")

    def factor_at(self, t: float) -> float:
        """The rate multiplier t seconds into the run."""
        in_burst = t >= self.start and (t - self.start) % self.every < self.length
        return self.factor if in_burst else 1.0


@dataclass(slots=True)
class _Plan:
    """When a lane stops taking requests."""

    requests: int | None
    deadline: float | None

    def open(self, sent: int, now: float) -> bool:
        return (self.requests is None or sent < self.requests) and (
            self.deadline is None or now < self.deadline
        )


@dataclass(slots=True)
class _Lane:
    """One target's copy of the run."""

    target: Target
    session: aiohttp.ClientSession
    turns: Iterator[Turn]
    body: dict[str, Any]
    """Fields every request shares (model, stream, temperature, ...)."""
    prefix: str
    session_header: bool
    on_done: Callable[[Sample], None]
    samples: list[Sample] = field(default_factory=list)
    histories: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    """Messages so far of each conversation still going."""
    tails: dict[str, asyncio.Event] = field(default_factory=dict)
    """Set when a conversation's latest dispatched turn is done; its next turn waits on it."""
    sent: int = 0
    finished_at: float = 0.0

    def take(self, plan: _Plan) -> tuple[Turn, asyncio.Event | None, asyncio.Event] | None:
        """The next request and the event of the turn it waits for (None: lane is done)."""
        if not plan.open(self.sent, time.perf_counter()):
            return None
        turn = next(self.turns)
        self.sent += 1
        before = self.tails.pop(turn.conversation, None) if turn.index else None
        mine = asyncio.Event()
        if not turn.last:
            self.tails[turn.conversation] = mine
        return turn, before, mine

    async def execute(self, turn: Turn, before: asyncio.Event | None, mine: asyncio.Event) -> None:
        try:
            if before is not None:
                await before.wait()
            history = self.histories.setdefault(turn.conversation, [])
            messages = self._messages(turn, history)
            body = {**self.body, "max_tokens": turn.max_tokens, "messages": messages}
            headers = {"x-session-id": turn.conversation} if self.session_header else None
            url = f"{self.target.base_url}/chat/completions"
            sample = await stream_chat(self.session, url, body, turn, headers)
            if turn.last:
                del self.histories[turn.conversation]
            else:
                history += [
                    {"role": "user", "content": turn.user},
                    {"role": "assistant", "content": sample.answer},
                ]
            self.samples.append(sample)
            self.finished_at = time.perf_counter()
            self.on_done(sample)
        finally:
            mine.set()

    def report(self, info: RunInfo, started: float, steady_after: int = 0) -> Report:
        return summarize(
            self.samples,
            target=self.target.name,
            base_url=self.target.base_url,
            info=info,
            elapsed=max(self.finished_at - started, 0.0),
            steady_after=steady_after,
        )

    def _messages(self, turn: Turn, history: list[dict[str, str]]) -> list[dict[str, str]]:
        first, *rest = [
            *([{"role": "system", "content": turn.system}] if turn.system else []),
            *history,
            {"role": "user", "content": turn.user},
        ]
        return [{**first, "content": self.prefix + first["content"]}, *rest]


async def run(workload: Workload, target: Target, options: Options | None = None) -> Report:
    """Replay workload against one target and report."""
    (report,) = await compare(workload, [target], options, isolate=False)
    return report


async def compare(
    workload: Workload,
    targets: Sequence[Target],
    options: Options | None = None,
    *,
    isolate: bool = True,
) -> list[Report]:
    """Replay the same seeded stream against every target at once; one report each."""
    opts = options or Options()
    connections = OPEN_LOOP_CONNECTIONS if opts.rate else opts.workers
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(open_session(t, connections, opts.timeout))
            for t in targets
        ]
        model = opts.model or await first_model(sessions[0], targets[0].base_url)
        fleet = _Fleet(targets, sessions, model, opts)
        if opts.warmup:
            warm = fleet.lanes(Tiny(), ["warmup "] * len(targets), _ignore)
            await _closed_loop(warm, min(opts.warmup, opts.workers), _Plan(opts.warmup, None))
        return await _measure(fleet, workload, isolate=isolate)


@dataclass(frozen=True, slots=True)
class _Fleet:
    """The targets of a run with their open clients."""

    targets: Sequence[Target]
    sessions: Sequence[aiohttp.ClientSession]
    model: str
    opts: Options

    def lanes(
        self, workload: Workload, prefixes: Sequence[str], on_done: Callable[[Sample], None]
    ) -> list[_Lane]:
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        }
        if self.opts.ignore_eos:
            body["ignore_eos"] = True
        return [
            _Lane(t, s, workload.turns(self.opts.seed), body, p, self.opts.session_header, on_done)
            for t, s, p in zip(self.targets, self.sessions, prefixes, strict=True)
        ]


async def _measure(fleet: _Fleet, workload: Workload, *, isolate: bool) -> list[Report]:
    opts = fleet.opts
    total = opts.requests
    if total is None and opts.duration is None:
        total = workload.default_requests()
    lanes_total = None if total is None else total * len(fleet.targets)
    bar = Progress(sys.stderr, total=lanes_total, duration=opts.duration) if opts.progress else None

    def on_done(sample: Sample) -> None:
        if bar is not None:
            bar.advance(failed=sample.error is not None)

    prefixes = [opts.salt + (f"[T{k}] " if isolate else "") for k in range(len(fleet.targets))]
    lanes = fleet.lanes(workload, prefixes, on_done)
    started = time.perf_counter()
    plan = _Plan(total, None if opts.duration is None else started + opts.duration)
    try:
        if opts.rate:
            await _open_loop(lanes, opts.rate, plan, opts.seed, opts.bursts)
        else:
            await _closed_loop(lanes, opts.workers, plan)
    finally:
        if bar is not None:
            bar.close()
    info = RunInfo(workload=workload.name, seed=opts.seed, model=fleet.model, load=opts.load)
    return [lane.report(info, started, opts.steady_after) for lane in lanes]


def _ignore(sample: Sample) -> None:
    """Warmup results are not measured."""


async def _closed_loop(lanes: Sequence[_Lane], workers: int, plan: _Plan) -> None:
    async with asyncio.TaskGroup() as tg:
        for lane in lanes:
            for _ in range(workers):
                tg.create_task(_worker(lane, plan))


async def _worker(lane: _Lane, plan: _Plan) -> None:
    while (job := lane.take(plan)) is not None:
        await lane.execute(*job)


def arrival_offsets(rate: float, seed: int, bursts: Bursts | None = None) -> Iterator[float]:
    """Seconds from the start of each arrival of a seeded Poisson process.

    With bursts the rate varies, so candidates are drawn at the peak rate and each is
    kept with probability rate(t) / peak (thinning): an exact inhomogeneous Poisson
    process, the same for the same seed.
    """
    arrivals = random.Random(f"{seed}:arrivals")
    peak = rate * (bursts.factor if bursts else 1.0)
    at = 0.0
    while True:
        at += arrivals.expovariate(peak)
        if bursts is None or arrivals.random() * bursts.factor < bursts.factor_at(at):
            yield at


async def _open_loop(
    lanes: Sequence[_Lane], rate: float, plan: _Plan, seed: int, bursts: Bursts | None
) -> None:
    start = time.perf_counter()
    offsets = arrival_offsets(rate, seed, bursts)
    async with asyncio.TaskGroup() as tg:
        for i in itertools.count():
            at = start + next(offsets)
            if plan.deadline is not None and at >= plan.deadline:
                return
            await asyncio.sleep(max(at - time.perf_counter(), 0))
            order = [*lanes[i % len(lanes) :], *lanes[: i % len(lanes)]]
            jobs = [(lane, lane.take(plan)) for lane in order]
            for lane, job in jobs:
                if job is None:
                    return
                tg.create_task(lane.execute(*job))
