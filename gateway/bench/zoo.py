"""The workload zoo: the prompt shapes routing is judged on, each at a stated load.

A scenario is a seeded workload plus the conditions it runs under: the share of the
cluster's capacity it offers (``load``), an optional burst schedule, and optional
per-instance speeds (a backend slower than the others).

Capacity comes from the simulator's own cost model, not from a measurement: a scheduler
step costs ``step_ms``, plus ``prefill_token_ms`` per uncached prompt token, plus
``decode_seq_ms`` per decoding sequence, all divided by the instance's ``speed``. A call
therefore costs, in engine milliseconds at a full batch of B sequences,

    prefill_token_ms * new_tokens + output_tokens * (step_ms / B + decode_seq_ms)

where ``new_tokens`` is what an ideal router leaves uncached (the message new to its
conversation; a system prompt, document or history only the first time it is seen) and B
is the most sequences that run at once: ``max_num_seqs``, or fewer when their private KV
(prompt and answer beyond a system prompt they share) fills the cache. The cluster's
capacity is the sum over instances of ``speed * 1000 / cost`` calls per second: what it
sustains with ideal placement and unlimited cache reuse. A load of 0.7 sends 70% of that;
a router that prefills more than the ideal one (round robin, a scattered conversation)
is then closer to saturation, which is the point. ``profile`` measures the mean tokens
from the workload's own seeded stream (sim tokens: a word is one, a chat message adds 13).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.bench.runner import Bursts
from gateway.bench.workloads import (
    Agents,
    Documents,
    MultiTurn,
    SharedPrefix,
    Tenants,
    Turn,
    Workload,
)
from gateway.sim.config import SimConfig

MESSAGE_TOKENS = 13
"""What the simulator's chat template adds to a message (role markers, the period)."""
PROFILE_TURNS = 3000


@dataclass(frozen=True, slots=True)
class Scenario:
    """One entry of the zoo: a workload and the conditions it is replayed under."""

    name: str
    workload: Workload
    load: float = 0.7
    """Share of the cluster's capacity offered (outside bursts)."""
    bursts: Bursts | None = None
    speeds: tuple[float, ...] = ()
    """Per instance; empty: every instance at speed 1."""
    balanceable: bool = True
    """Whether even work per instance is the right goal (not with a slow backend: the
    fastest placement runs the faster instances at the higher utilization)."""


@dataclass(frozen=True, slots=True)
class Profile:
    """Mean tokens per call of a workload's stream, as the capacity model needs them."""

    prompt: float
    new: float
    """Left uncached by an ideal router with unlimited cache."""
    private: float
    """KV a running call pins that no concurrent call of another conversation shares."""
    output: float


def profile(workload: Workload, seed: int = 0, turns: int = PROFILE_TURNS) -> Profile:
    """Mean token counts over the first ``turns`` calls of the seeded stream; answers are
    taken at their max_tokens (the benchmark asks for exactly that many)."""
    seen: set[str] = set()
    history: dict[str, float] = {}
    totals = [0.0, 0.0, 0.0, 0.0]
    for turn in itertools.islice(workload.turns(seed), turns):
        system = tokens(turn.system) if turn.system else 0.0
        message = tokens(turn.user)
        past = history.pop(turn.conversation, 0.0)
        prompt = system + past + message + 6
        new = message + 6 + (0.0 if turn.system in seen or not system else system)
        seen.add(turn.system)
        if not turn.last:
            history[turn.conversation] = past + message + turn.max_tokens + MESSAGE_TOKENS
        private = prompt + turn.max_tokens - system
        for i, v in enumerate((prompt, new, private, turn.max_tokens)):
            totals[i] += v
    count = max(turns, 1)
    return Profile(*(t / count for t in totals))


def tokens(text: str) -> float:
    return len(text.split()) + MESSAGE_TOKENS


def call_cost_ms(p: Profile, config: SimConfig) -> float:
    """Engine milliseconds one call costs at speed 1, at the batch its KV allows."""
    kv_tokens = config.cache_blocks * config.block_size
    batch = max(1.0, min(config.max_num_seqs, kv_tokens / max(p.private, 1.0)))
    decode = p.output * (config.step_ms / batch + config.decode_seq_ms)
    return config.prefill_token_ms * p.new + decode


def capacity(p: Profile, config: SimConfig, speeds: Sequence[float]) -> float:
    """Calls per second the cluster sustains under ideal placement."""
    return sum(speed * 1000 / call_cost_ms(p, config) for speed in speeds)


def rate(
    scenario: Scenario,
    config: SimConfig,
    instances: int,
    load: float | None = None,
    *,
    seed: int,
) -> float:
    """Poisson arrivals per second for the scenario at its load (or ``load``), profiled on
    the seed to be replayed: a seed draws its own prompt and answer lengths (tenants' most
    of all), so one seed's rate would run another's calls at another share of capacity."""
    speeds = scenario.speeds or (1.0,) * instances
    if len(speeds) != instances:
        raise ValueError(f"{scenario.name} has {len(speeds)} speeds for {instances} instances")
    share = scenario.load if load is None else load
    return share * capacity(profile(scenario.workload, seed), config, speeds)


def steady_after(duration: float, requests: int) -> int:
    """Requests sent in the first quarter of a run: the caches warm up meanwhile."""
    return requests // 4 if duration > 0 else 0


SHARED_PREFIX = SharedPrefix(groups=32, prefix_words=1000, questions=16, max_tokens=32)
MULTI_TURN = MultiTurn(conversations=47, turns_per_conversation=6, message_words=96, max_tokens=64)
"""47, not 48: with a multiple of the instance count, round robin over the turn-major
order would send every turn of a conversation to the same instance and look sticky."""

ZOO: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("shared-prefix", SHARED_PREFIX, load=0.6),
        Scenario("multi-turn", MULTI_TURN, load=0.7),
        Scenario("agents", Agents(), load=0.7),
        Scenario("documents", Documents(), load=0.7),
        Scenario("tenants", Tenants(), load=0.8),
        Scenario("bursts", Agents(), load=0.45, bursts=Bursts()),
        Scenario("slow-backend", MULTI_TURN, load=0.6, speeds=(1, 1, 1, 0.5), balanceable=False),
    )
}


def first_turns(workload: Workload, n: int, seed: int = 0) -> list[Turn]:
    return list(itertools.islice(workload.turns(seed), n))
