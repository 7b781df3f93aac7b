"""Idle cost: the CPU an unloaded gateway spends probing its backends' health and load.

    python -m gateway.bench.idle [--backends 4 64] [--seconds 30] [--baseline TREE]

One ``gateway sim --instances N`` stands for N backends (each answers /health and a
vLLM-shaped /metrics); a gateway with those N backends under one model serves no call,
and its CPU time (user + system, /proc/<pid>/stat) over --seconds is its probing. Every
gateway measured runs in the same seconds, so the machine's other tenants weigh on all of
them alike; --baseline TREE also runs each size from another checkout (``git archive main
| tar -x -C TREE``) for a before/after ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gateway.bench.overhead import process
from gateway.bench.paired import load_range, tree_cpu_seconds


def gateway_cmd(name: str, sim: int, backends: int, port: int, tmp: Path) -> list[str]:
    urls = ", ".join(f"{{url: 'http://127.0.0.1:{sim + i}'}}" for i in range(backends))
    config = tmp / f"{name}.yaml"
    config.write_text(
        "server: {access_log: false, log_level: warning}\n"
        f"models: [{{name: sim-model, backends: [{urls}]}}]\n"
        f"database: {{url: 'sqlite:///{tmp}/{name}.db'}}\n"
        f"ledger: {{spool_dir: '{tmp}/{name}-spool'}}\n"
    )
    serve = ["-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
    # -P: the working directory never shadows the checkout chosen (--baseline's PYTHONPATH).
    return [sys.executable, "-P", *serve]


def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gw-idle-"))
    trees = {"": None} if args.baseline is None else {"": None, "baseline ": args.baseline}
    pids: dict[str, int] = {}
    port = args.port_base
    with contextlib.ExitStack() as stack:
        for n in args.backends:
            sim = port
            port += n
            stack.enter_context(process(
                [sys.executable, "-m", "gateway", "sim", "--instant", "--instances", str(n),
                 "--port", str(sim)],
                f"http://127.0.0.1:{sim + n - 1}/health", tmp / f"sim-{n}.log"))  # fmt: skip
            for label, tree in trees.items():
                name = f"{label}{n} backends"
                env = {**os.environ, **({"PYTHONPATH": str(tree)} if tree else {})}
                cmd = gateway_cmd(name.replace(" ", "-"), sim, n, port, tmp)
                ready = f"http://127.0.0.1:{port}/health"
                proc = stack.enter_context(process(cmd, ready, tmp / f"{name}.log", env=env))
                pids[name] = proc.pid
                port += 1
        time.sleep(3)  # past the first probes and the ledger's start
        loads: list[float] = []
        samples: dict[str, list[float]] = {name: [] for name in pids}
        for _ in range(args.rounds):
            before = {name: tree_cpu_seconds(pid) for name, pid in pids.items()}
            time.sleep(args.seconds)
            for name, pid in pids.items():
                samples[name].append((tree_cpu_seconds(pid) - before[name]) / args.seconds * 1e3)
            loads.append(os.getloadavg()[0])
    print(f"{args.rounds} rounds x {args.seconds} s; {load_range(loads)}")
    print("| gateway | CPU ms per second, median (range) |")
    print("|---|---|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--seconds", type=float, default=10, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout, run beside this one")
    parser.add_argument("--port-base", type=int, default=19400)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
