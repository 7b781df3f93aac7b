"""Paired load: several proxies, each in front of its own simulator, loaded at once.

    python -m gateway.bench.paired --target uvicorn=gateway --target granian=granian \
        [--target vllm=vllm-router] [--max-tokens 256 --stream] [--system-words 300] \
        [--rounds 6] [--seconds 4]

On a shared machine a figure from one run says little; two targets loaded in the same
seconds see the same machine, so each round's ratio to the first target is what this
reports (median and range over the rounds), with the load average during the run.
Each round drives every target at once with its own ``wrk -t1`` and reads each target's
CPU time (user + system of its process and every descendant, from /proc/<pid>/stat)
before and after: CPU per call and per streamed token is what the target itself spent,
whatever the machine's other tenants did to the wall clock.

Kinds: ``gateway`` (`gateway serve`, uvicorn), ``granian`` (the same app under Granian's
ASGI interface), ``vllm-router`` and ``sglang-router`` (``deploy/bench/peers.sh``), each
optionally ``kind:policy`` for the Rust routers (default cache_aware) or ``gateway:2``
for worker processes, and ``gateway@TREE`` runs another checkout (``git archive main |
tar -x -C TREE``): old code against new, loaded in the same seconds. With --pin (the
default on two cores) the targets share core 0 and simulators and wrk run on core 1, so a
target never competes with its own load.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from gateway.bench.overhead import process
from gateway.bench.routers import ROUTERS, Setup, rust_router

CHAT_LUA = Path(__file__).resolve().parents[2] / "deploy" / "wrk" / "chat.lua"
HZ = os.sysconf("SC_CLK_TCK")


Kind = Literal["gateway", "granian", "vllm-router", "sglang-router"]
KINDS: tuple[Kind, ...] = get_args(Kind)


def target_kind(text: str) -> Kind:
    """The kind a --target names; an unknown one stops the run before anything starts."""
    for kind in KINDS:
        if text == kind:
            return kind
    raise SystemExit(f"bench.paired: unknown target kind {text!r} (one of {', '.join(KINDS)})")


@dataclass
class Target:
    name: str
    kind: Kind
    option: str
    tree: str
    """Another checkout to run the gateway from (empty: this one)."""
    port: int
    sim_port: int
    pid: int = 0
    rps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    """CPU microseconds per call, one per round."""


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of root and all its descendants still running."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(entry.path, "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            pid = int(entry.name)
            parent[pid] = int(fields[1])
            ticks[pid] = int(fields[11]) + int(fields[12])
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += ticks.get(pid, 0)
        stack += [p for p, pp in parent.items() if pp == pid]
    return total / HZ


def command(
    t: Target, tmp: Path, args: argparse.Namespace
) -> tuple[list[str], dict[str, str], str]:
    """The target's command line, environment and readiness URL."""
    url = f"http://127.0.0.1:{t.port}"
    sim = f"http://127.0.0.1:{t.sim_port}"
    if t.kind == "gateway" or t.kind == "granian":
        config = tmp / f"{t.name}.yaml"
        database = args.database_url or f"sqlite:///{tmp}/{t.name}.db"
        config.write_text(
            "server: {access_log: false, log_level: warning}\n"
            f"models: [{{name: sim-model, backends: [{{url: '{sim}'}}]}}]\n"
            f"database: {{url: '{database}', auto_migrate: true}}\n"
            f"ledger: {{spool_dir: '{tmp}/{t.name}-spool'}}\n"
            "auth: {enabled: false}\n"  # as the routers: no keys to check
        )
        workers = t.option or "1"
        env = {**os.environ, "GATEWAY_CONFIG_FILE": str(config)}
        # -P: the working directory never shadows the checkout chosen.
        python = [sys.executable, "-P"]
        if t.tree:
            env["PYTHONPATH"] = t.tree
        if t.kind == "gateway":
            cmd = [*python, "-m", "gateway", "serve", "--config", str(config),
                   "--port", str(t.port), "--workers", workers]  # fmt: skip
        else:
            cmd = [*python, "-m", "granian", "--interface", "asgi", "--factory",
                   "--loop", "uvloop", "--no-access-log", "--log-level", "warning",
                   "--port", str(t.port), "--workers", workers,
                   "gateway.serve:worker_app"]  # fmt: skip
        return cmd, env, url + "/health"
    setup = Setup(t.name, t.kind, ("--policy", t.option or "cache_aware"))
    return rust_router(setup, [sim], t.port, args.routers), dict(os.environ), url + "/v1/models"


def start_wrk(t: Target, args: argparse.Namespace, pin: list[str]) -> subprocess.Popen[str]:
    url = f"http://127.0.0.1:{t.port}/v1/chat/completions"
    cmd = [*pin, "wrk", "-t1", f"-c{args.concurrency}", f"-d{args.seconds}s", "--timeout",
           "30s", "-s", str(CHAT_LUA), url, "--", "sim-model", "", str(args.max_tokens),
           "stream" if args.stream else "", str(args.system_words)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def parse_wrk(out: str) -> tuple[int, float]:
    """Calls completed and calls per second; a non-2xx answer fails the run."""
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"errors under load:\n{out}")
    calls = rps = 0.0
    for line in out.splitlines():
        if "requests in" in line:
            calls = float(line.split()[0])
        elif line.startswith("Requests/sec:"):
            rps = float(line.split()[1])
    return int(calls), rps


def one_round(targets: list[Target], args: argparse.Namespace, pin: list[str]) -> None:
    before = [tree_cpu_seconds(t.pid) for t in targets]
    loads = [start_wrk(t, args, pin) for t in targets]
    outs = [p.communicate(timeout=args.seconds + 60)[0] for p in loads]
    after = [tree_cpu_seconds(t.pid) for t in targets]
    for t, out, b, a in zip(targets, outs, before, after, strict=True):
        calls, rps = parse_wrk(out)
        t.rps.append(rps)
        t.cpu_us.append((a - b) / max(calls, 1) * 1e6)


def load_range(loads: list[float]) -> str:
    """The machine's 1-minute load average over the run, as the figures' context."""
    return f"load average {min(loads):.1f}-{max(loads):.1f}"


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def report(targets: list[Target], args: argparse.Namespace, loads: list[float]) -> None:
    base = targets[0]
    med = statistics.median
    tokens = args.max_tokens if args.stream else 1
    print(f"c={args.concurrency}, max_tokens={args.max_tokens}, stream={args.stream}, "
          f"system_words={args.system_words}, "
          f"{args.rounds} rounds x {args.seconds} s; {load_range(loads)}")  # fmt: skip
    print(f"| target | req/s | CPU us/call | CPU us/token | req/s vs {base.name} "
          f"| CPU/call vs {base.name} |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for t in targets:
        rps_ratio = [r / b for r, b in zip(t.rps, base.rps, strict=True)]
        cpu_ratio = [c / b for c, b in zip(t.cpu_us, base.cpu_us, strict=True)]
        per_token = med(t.cpu_us) / tokens
        print(f"| {t.name} | {med(t.rps):,.0f} | {med(t.cpu_us):,.0f} | {per_token:,.1f} "
              f"| {spread(rps_ratio)} | {spread(cpu_ratio)} |")  # fmt: skip


def run(args: argparse.Namespace) -> None:
    pin = args.pin if args.pin is not None else os.cpu_count() == 2
    load_core = ["taskset", "-c", "1"] if pin else []
    target_core = ["taskset", "-c", "0"] if pin else []
    targets = []
    for i, spec in enumerate(args.target):
        name, _, kind = spec.partition("=")
        kind, _, tree = kind.partition("@")
        kind, _, option = kind.partition(":")
        base = args.port_base + 10 * i
        targets.append(Target(name, target_kind(kind), option, tree, base + 1, base))
    tmp = Path(tempfile.mkdtemp(prefix="gw-paired-"))
    loads: list[float] = []
    with contextlib.ExitStack() as stack:
        for t in targets:
            sim = [*load_core, sys.executable, "-m", "gateway", "sim", *sim_pace(args),
                   "--port", str(t.sim_port)]  # fmt: skip
            stack.enter_context(process(sim, f"http://127.0.0.1:{t.sim_port}/health",
                                        tmp / f"sim-{t.name}.log"))  # fmt: skip
        for t in targets:
            cmd, env, ready = command(t, tmp, args)
            proc = stack.enter_context(process([*target_core, *cmd], ready,
                                               tmp / f"{t.name}.log", env=env))  # fmt: skip
            t.pid = proc.pid
        warm = argparse.Namespace(**{**vars(args), "seconds": 2})
        one_round(targets, warm, load_core)
        for t in targets:
            t.rps.clear()
            t.cpu_us.clear()
        for i in range(args.rounds):
            # Neither side always starts its load first.
            order = targets if i % 2 == 0 else targets[::-1]
            one_round(order, args, load_core)
            loads.append(os.getloadavg()[0])
            time.sleep(0.5)
    report(targets, args, loads)


def sim_pace(args: argparse.Namespace) -> list[str]:
    """The simulators' pace: instant, or (``--step-ms``) one token per stream per step of
    that many milliseconds, every call decoding at once, as a GPU's batch does. Instant
    answers arrive in a read or two per call, so what they measure is a call's fixed cost;
    paced ones arrive a token per read, the relay's cost per chunk, as streams from a real
    backend do."""
    if args.step_ms is None:
        return ["--instant"]
    return ["--step-ms", str(args.step_ms), "--prefill-token-ms", "0", "--decode-seq-ms", "0",
            "--max-num-seqs", str(max(256, 2 * args.concurrency))]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", required=True,
                        help="NAME=KIND[:OPTION][@TREE]; the first: ratios' base")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--system-words", type=int, default=0,
                        help="an app's shape: a system prompt of this many words (the same "
                        "on every call) and a new question per call; 0: one tiny body")  # fmt: skip
    parser.add_argument("--step-ms", type=float,
                        help="pace the simulators: a token per stream every STEP_MS")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4, help="seconds per round")
    parser.add_argument("--port-base", type=int, default=19300,
                        help="target i: simulator on BASE+10i, itself on BASE+10i+1")  # fmt: skip
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--routers", type=Path, default=ROUTERS)
    parser.add_argument("--database-url", help="the gateways' ledger (default: SQLite each)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
