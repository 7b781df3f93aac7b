"""The routing benchmark: the workload zoo against every router, one fresh cluster per run.

``python -m gateway.bench.routing --workload all --seeds 0 1 --json zoo.json``

For each scenario of the zoo (:mod:`gateway.bench.zoo`), seed and router configuration
(:mod:`gateway.bench.routers`) it starts a FRESH simulated cluster (4 instances whose
caches each hold a fraction of the working set, at the scenario's speeds), the router in
front of it, replays the scenario's seeded workload as Poisson arrivals at its share of the
cluster's capacity for a fixed time, reads the figures, and tears it all down. Fresh
clusters, because a cache warmed by the previous configuration would flatter the next; one
after another, because on two cores concurrent clusters would slow each other.

Figures: the cached share of all prompt tokens (backend-reported), TTFT p50/p99, calls and
engine seconds per instance (each instance's own counters), over the whole run and the
steady window
(calls sent after the first quarter of the run); for the gateway, its prediction accuracy.
Then the checks of :mod:`gateway.bench.judge`, per scenario and seed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.bench import cluster, judge, zoo
from gateway.bench.client import Target
from gateway.bench.judge import Result
from gateway.bench.report import Report
from gateway.bench.routers import (
    ROUTERS,
    SETUPS,
    ZOO_SETUPS,
    Setup,
    by_label,
    front_of,
    prediction_misses,
    scrape,
)
from gateway.bench.runner import Options, run
from gateway.sim.config import SimConfig

UNLIMITED_BLOCKS = 10_000_000
T = TypeVar("T")
QUICK_DURATION = 8.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Bench:
    """What every configuration gets the same of."""

    duration: float = 20.0
    """Seconds of arrivals per run (calls in flight then still finish)."""
    load: float | None = None
    """Share of the cluster's capacity for every scenario; None: each scenario's own."""
    speed: float = 0.5
    """Every instance's speed is multiplied by this (see --speed)."""
    instances: int = 4
    cache_blocks: int = 1000
    max_num_seqs: int = 8
    routers: Path = ROUTERS
    gateway_routing: dict[str, Any] = field(default_factory=dict)
    """Extra routing settings for the gateway configurations (tuning experiments)."""
    logs: Path | None = None
    """Keep every process's log (and the gateway's ledger) here; None: a temporary dir."""

    def sim_options(self, scenario: zoo.Scenario, instances: int) -> list[str]:
        """`gateway sim` options beyond the cache: the batch limit and each instance's speed."""
        speeds = (scenario.speeds or (1.0,) * self.instances)[:instances]
        speed = ",".join(f"{v * self.speed:g}" for v in speeds)
        return ["--max-num-seqs", str(self.max_num_seqs), "--speed", speed]

    def rate(self, scenario: zoo.Scenario, seed: int) -> float:
        config = SimConfig(cache_blocks=self.cache_blocks, max_num_seqs=self.max_num_seqs)
        at_speed_one = zoo.rate(scenario, config, self.instances, self.load, seed=seed)
        return at_speed_one * self.speed


async def measure(setup: Setup, scenario: zoo.Scenario, seed: int, bench: Bench) -> Result:
    """Fresh cluster, router, one replay, teardown: one row of the table."""
    with contextlib.ExitStack() as keep:
        root = bench.logs or Path(keep.enter_context(tempfile.TemporaryDirectory()))
        root.mkdir(parents=True, exist_ok=True)
        logs = Path(tempfile.mkdtemp(prefix=f"{scenario.name}-{setup.name}-", dir=root))
        instances = 1 if setup.single else bench.instances
        blocks = UNLIMITED_BLOCKS if setup.single else bench.cache_blocks
        rate = bench.rate(scenario, seed)
        sim = bench.sim_options(scenario, instances)
        warmup = bench.duration / 4
        opts = Options(rate=rate, duration=bench.duration, seed=seed, bursts=scenario.bursts,
                       session_header=setup.session_header, timeout=300,
                       steady_after=max(1, round(rate * warmup)))  # fmt: skip
        async with (
            cluster.simulators(instances, blocks, logs, *sim) as urls,
            front_of(setup, urls, logs, bench.routers, {"routing": bench.gateway_routing}) as front,
        ):
            async with asyncio.TaskGroup() as tg:
                replay = tg.create_task(run(scenario.workload, Target(f"{front.url}/v1"), opts))
                early = tg.create_task(tally_after(urls, warmup))
            work = await tally(urls)
            metrics = await scrape(front.url) if front.gateway else ""
        result = summarize(setup, scenario, seed, rate, replay.result(), work, early.result())
        result.predictions = by_label(metrics, "gateway_cache_predictions", "outcome")
        result.decisions = by_label(metrics, "gateway_routing_decisions", "decision")
        result.machine_load = os.getloadavg()[0]
        if front.ledger is not None:
            result.misses_by_decision = prediction_misses(front.ledger)
        return result


async def tally_after(urls: list[str], delay: float) -> Work:
    """Each instance's work once the warm-up is over."""
    await asyncio.sleep(delay)
    return await tally(urls)


async def tally(urls: list[str]) -> Work:
    calls, busy = await cluster.totals(urls, "vllm:request_success", "vllm:engine_busy_seconds")
    return Work({k: int(v) for k, v in calls.items()}, busy)


def summarize(
    setup: Setup,
    scenario: zoo.Scenario,
    seed: int,
    rate: float,
    report: Report,
    work: Work,
    early: Work,
) -> Result:
    steady, after = report.steady, work.since(early)
    return Result(
        setup=setup.name,
        workload=scenario.name,
        seed=seed,
        rate=rate,
        requests=report.requests,
        ok=report.ok,
        errors=report.errors,
        hit_ratio=report.hit_ratio,
        ttft_p50_ms=report.ttft_ms["p50"],
        ttft_p99_ms=report.ttft_ms["p99"],
        instances=work.calls,
        imbalance=imbalance(work.calls),
        busy={k: round(v, 3) for k, v in work.busy.items()},
        work_imbalance=imbalance(work.busy),
        balanceable=scenario.balanceable,
        steady_hit=steady.hit_ratio if steady else None,
        steady_p50_ms=steady.ttft_ms["p50"] if steady else None,
        steady_p99_ms=steady.ttft_ms["p99"] if steady else None,
        steady_imbalance=imbalance(after.calls),
        steady_work_imbalance=imbalance(after.busy),
    )


@dataclass(frozen=True, slots=True)
class Work:
    """What each instance did so far: calls finished, and engine seconds (the sim's cost
    model), which weighs a long prompt or answer as the load it is."""

    calls: dict[str, int]
    busy: dict[str, float]

    def since(self, early: Work) -> Work:
        return Work(
            {k: v - early.calls.get(k, 0) for k, v in self.calls.items()},
            {k: v - early.busy.get(k, 0.0) for k, v in self.busy.items()},
        )


def imbalance(counts: Mapping[str, float]) -> float | None:
    """The busiest instance's share over the mean."""
    mean = sum(counts.values()) / len(counts) if counts else 0
    return max(counts.values()) / mean if mean else None


async def campaign(
    scenarios: Sequence[zoo.Scenario],
    setups: Sequence[Setup],
    seeds: Sequence[int],
    bench: Bench,
    save: Path | None = None,
) -> list[Result]:
    """Every setup on every scenario and seed; every other seed runs the setups in reverse
    order, so no configuration always runs first (or last) on a drifting machine. The
    results so far are saved after every run: an hour's campaign cut short keeps them."""
    results = []
    for n, seed in enumerate(seeds):
        order = setups if n % 2 == 0 else list(reversed(setups))
        for scenario in scenarios:
            for setup in order:
                result = await measure(setup, scenario, seed, bench)
                print(judge.line(result), file=sys.stderr, flush=True)
                results.append(result)
                if save is not None:
                    write_json(save, results)
    return results


def write_json(path: Path, results: Sequence[Result]) -> None:
    """A few kilobytes between runs: blocking the loop for it costs no measurement."""
    rows = [asdict(r) for r in results]
    path.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gateway.bench.routing")
    add_arguments(parser)
    return parser.parse_args(argv)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options, for `python -m gateway.bench.routing` and `gateway bench routing`."""
    d = Bench()
    p.description = __doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--workload", nargs="+", choices=[*zoo.ZOO, "all"], default=["all"],
                   metavar="SCENARIO", help=f"scenarios of the zoo: {', '.join(zoo.ZOO)}, "
                   "or all (default)")  # fmt: skip
    p.add_argument("--configs", nargs="+", choices=list(SETUPS), default=list(ZOO_SETUPS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--duration", type=float, default=d.duration,
                   help="seconds of arrivals per run")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {QUICK_DURATION:g} s a run, first seed only")  # fmt: skip
    p.add_argument("--load", type=float,
                   help="share of the cluster's capacity, for every scenario "
                   "(default: each scenario's own, 0.45-0.8)")  # fmt: skip
    p.add_argument("--speed", type=float, default=d.speed,
                   help="multiply every instance's speed: a slower model, fewer calls per "
                   "second for the same load")  # fmt: skip
    p.add_argument("--instances", type=int, default=d.instances)
    p.add_argument("--cache-blocks", type=int, default=d.cache_blocks, help="per instance")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                   help="sequences each instance runs at once (the rest wait)")  # fmt: skip
    p.add_argument("--routers", type=Path, default=ROUTERS, help="dir of the peer routers")
    p.add_argument("--gateway-routing", default="{}", help="JSON: extra routing settings")
    p.add_argument("--logs", type=Path, help="keep every process's log and ledger here")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--from-json", type=Path, nargs="+",
                   help="print the tables of saved results, run none")  # fmt: skip


def chosen(args: argparse.Namespace) -> list[zoo.Scenario]:
    names = list(zoo.ZOO) if "all" in args.workload else list(dict.fromkeys(args.workload))
    return [zoo.ZOO[name] for name in names]


def bench_from(args: argparse.Namespace) -> Bench:
    return Bench(
        duration=QUICK_DURATION if args.quick else args.duration,
        load=args.load,
        speed=args.speed,
        instances=args.instances,
        cache_blocks=args.cache_blocks,
        max_num_seqs=args.max_num_seqs,
        routers=args.routers,
        gateway_routing=orjson.loads(args.gateway_routing),
        logs=args.logs,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return execute(parse_args(argv))


async def stopped_by_sigterm(work: Coroutine[Any, Any, T]) -> T:
    """Run work; SIGTERM cancels it, so every cluster and router it started is stopped
    (by default SIGTERM would end this process and leave them running)."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await work


def execute(args: argparse.Namespace) -> int:
    if args.from_json:
        results = [Result(**row) for path in args.from_json for row in orjson.loads(
            path.read_bytes())]  # fmt: skip
    else:
        setups = [SETUPS[name] for name in args.configs]
        seeds = args.seeds[:1] if args.quick else args.seeds
        work = campaign(chosen(args), setups, seeds, bench_from(args), args.json)
        results = asyncio.run(stopped_by_sigterm(work))
    checks = judge.judge(results)
    print(judge.render(results))
    print(judge.render_misses(results))
    print(judge.render_checks(checks))
    print(judge.markdown(results))
    print(judge.markdown_checks(checks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
