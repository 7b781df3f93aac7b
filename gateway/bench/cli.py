"""`gateway bench run|compare`: replay a seeded workload, print a table, optionally JSON
(`gateway bench limits`: a rate limit across replicas, bench/limits.py).

    gateway bench run --base-url http://127.0.0.1:8000/v1 --workload shared-prefix \\
        --concurrency 8 --requests 200 --json out.json
    gateway bench compare --target rr=http://127.0.0.1:8081/v1 \\
        --target cache=http://127.0.0.1:8082/v1 --workload multi-turn --rate 4 --duration 30
    gateway bench limits --replicas 3 --clients 16 --seconds 20 --rpm 60 --runs 5

    gateway bench routing --workload all --seeds 0 1    # the zoo against every router

The subcommand is required (no implicit `run`), so a typo never silently benchmarks.
Without --requests or --duration a run sends one pass of its workload. Prompt lengths are
in words, each one cl100k token, so they are close to token counts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from gateway.bench import limits, routing, runner
from gateway.bench.client import Target, TargetUnavailable
from gateway.bench.report import Report, ratios, render, render_ratios
from gateway.bench.workloads import (
    Agents,
    Documents,
    Mixed,
    MultiTurn,
    SharedPrefix,
    Tenants,
    Tiny,
    Workload,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

WORKLOAD_NAMES = ("shared-prefix", "multi-turn", "mixed", "tiny", "agents", "documents", "tenants")
T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(
        dest="bench_command", required=True, metavar="{run,compare,routing,limits}"
    )
    run_p = sub.add_parser("run", help="one target")
    run_p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    run_p.add_argument("--label", default="", help="name shown in the report")
    cmp_p = sub.add_parser("compare", help="two or more targets at once, ratios vs the first")
    cmp_p.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="[LABEL=]URL",
        help="repeat: the first is the baseline",
    )
    cmp_p.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="send identical prompts to every target (only safe when they share no backend)",
    )
    for p in (run_p, cmp_p):
        _add_load(p)
        _add_workload(p)
    routing_p = sub.add_parser("routing", help="the workload zoo against every router")
    routing.add_arguments(routing_p)
    limits.add_arguments(sub.add_parser("limits", help="does a rate limit hold across replicas"))


def _add_load(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument(
        "--concurrency", type=int, help=f"closed loop (default {runner.DEFAULT_CONCURRENCY})"
    )
    mode.add_argument("--rate", type=float, help="Poisson arrivals per second (open loop)")
    g.add_argument("--requests", type=int, help="stop after N requests per target")
    g.add_argument("--duration", type=float, help="stop dispatching after S seconds")
    g.add_argument("--warmup", type=int, default=0, help="unmeasured tiny requests first")
    g.add_argument(
        "--steady-after",
        type=int,
        default=0,
        metavar="N",
        help="also report the figures without the first N requests (warm caches)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--model", help="default: the first model the (first) target lists")
    g.add_argument("--api-key")
    g.add_argument("--header", action="append", default=[], metavar="K:V", help="repeatable")
    g.add_argument(
        "--session-header", action="store_true", help="send each conversation's id as x-session-id"
    )
    g.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask vLLM for exactly max_tokens tokens",
    )
    g.add_argument("--salt", default="", help="prefix for every prompt (fresh cache keys)")
    g.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    g.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )


def _add_workload(p: argparse.ArgumentParser) -> None:
    sp, mt, tiny = SharedPrefix(), MultiTurn(), Tiny()
    g = p.add_argument_group("workload (unset flags keep the workload's defaults)")
    g.add_argument("--workload", choices=WORKLOAD_NAMES, default="shared-prefix")
    g.add_argument(
        "--max-tokens",
        type=int,
        help=f"answer length (default: shared-prefix "
        f"{sp.max_tokens}, multi-turn {mt.max_tokens}, tiny {tiny.max_tokens})",
    )
    g.add_argument("--groups", type=int, help=f"shared-prefix: system prompts ({sp.groups})")
    g.add_argument(
        "--prefix-words", type=int, help=f"shared-prefix: system prompt length ({sp.prefix_words})"
    )
    g.add_argument(
        "--questions",
        type=int,
        help=f"shared-prefix: questions per group per pass ({sp.questions})",
    )
    g.add_argument(
        "--question-words", type=int, help=f"shared-prefix: question length ({sp.question_words})"
    )
    g.add_argument(
        "--conversations", type=int, help=f"multi-turn: conversations per wave ({mt.conversations})"
    )
    g.add_argument(
        "--turns",
        type=int,
        help=f"multi-turn: turns per conversation ({mt.turns_per_conversation})",
    )
    g.add_argument(
        "--system-words",
        type=int,
        help=f"multi-turn, agents: shared system prompt length ({mt.system_words}, "
        f"{Agents().system_words})",
    )
    g.add_argument(
        "--message-words", type=int, help=f"multi-turn: user message length ({mt.message_words})"
    )
    g.add_argument("--prompt-words", type=int, help=f"tiny: prompt length ({tiny.prompt_words})")


def workload_from_args(args: argparse.Namespace) -> Workload:
    shared = _override(
        SharedPrefix(),
        groups=args.groups,
        prefix_words=args.prefix_words,
        questions=args.questions,
        question_words=args.question_words,
        max_tokens=args.max_tokens,
    )
    multi = _override(
        MultiTurn(),
        conversations=args.conversations,
        turns_per_conversation=args.turns,
        system_words=args.system_words,
        message_words=args.message_words,
        max_tokens=args.max_tokens,
    )
    tiny = _override(Tiny(), prompt_words=args.prompt_words, max_tokens=args.max_tokens)
    chosen: dict[str, Workload] = {
        "shared-prefix": shared,
        "multi-turn": multi,
        "mixed": Mixed(shared, multi),
        "tiny": tiny,
        "agents": _override(Agents(), system_words=_span(args.system_words)),
        "documents": Documents(),
        "tenants": Tenants(),
    }
    return chosen[args.workload]


def _override(base: D, **changes: int | tuple[int, int] | None) -> D:
    return replace(base, **{k: v for k, v in changes.items() if v is not None})


def _span(value: int | None) -> tuple[int, int] | None:
    """One length asked for where the workload draws a length from a span."""
    return None if value is None else (value, value)


def options_from_args(args: argparse.Namespace) -> runner.Options:
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    return runner.Options(
        model=args.model,
        seed=args.seed,
        concurrency=args.concurrency,
        rate=args.rate,
        requests=args.requests,
        duration=args.duration,
        warmup=args.warmup,
        timeout=args.timeout,
        session_header=args.session_header,
        ignore_eos=args.ignore_eos,
        salt=args.salt,
        progress=progress,
        steady_after=args.steady_after,
    )


def parse_target(value: str, api_key: str | None, headers: dict[str, str]) -> Target:
    """`label=url` or a bare url (its label is then the url itself)."""
    label, sep, url = value.partition("=")
    if not sep or "://" in label:
        label, url = "", value
    return Target(url.rstrip("/"), label, api_key, headers)


def parse_headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        key, sep, val = value.partition(":")
        if not sep or not key.strip():
            raise SystemExit(f"--header wants K:V, got {value!r}")
        headers[key.strip()] = val.strip()
    return headers


def run(args: argparse.Namespace) -> int:
    if args.bench_command == "routing":
        return routing.execute(args)
    if args.bench_command == "limits":
        return limits.run(args)
    headers = parse_headers(args.header)
    workload = workload_from_args(args)
    opts = options_from_args(args)
    try:
        if args.bench_command == "run":
            target = parse_target(args.base_url, args.api_key, headers)
            target = replace(target, label=args.label)
            reports = [_run_loop(runner.run(workload, target, opts))]
        else:
            targets = [parse_target(t, args.api_key, headers) for t in args.target]
            reports = _run_loop(runner.compare(workload, targets, opts, isolate=args.isolate))
    except TargetUnavailable as exc:
        print(f"gateway bench: {exc} (give --model to skip the lookup)", file=sys.stderr)
        return 2
    _emit(reports, args.json, compared=args.bench_command == "compare")
    return 0 if all(r.ok for r in reports) else 1


def _emit(reports: list[Report], json_path: Path | None, *, compared: bool) -> None:
    """A run's JSON is its report; a comparison's is {"reports": [...], "ratios": [...]}."""
    print("\n\n".join(render(r) for r in reports))
    rows = ratios(reports)
    if rows:
        print("\n" + render_ratios(rows))
    if json_path is not None:
        doc: Any = reports[0].to_dict()
        if compared:
            doc = {"reports": [r.to_dict() for r in reports], "ratios": rows}
        json_path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def _run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """uvloop where available: the generator's own overhead is part of what it measures."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
        return loop.run(coro)
