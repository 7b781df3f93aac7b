"""Cache-aware routing vs round robin in front of two real vLLM servers, in one run.

    python deploy/vllm-cpu/bench_routing.py [--requests N] [--concurrency C] [--json FILE]

Prepares vLLM (deploy/vllm-cpu/setup.sh), starts two servers on loopback, then for each
routing policy starts a gateway in front of both and replays the same seeded
`multi-turn` workload through it (each policy with its own prompt salt, so neither warms
the other's cache). The hit ratio is vLLM's own: the growth of
`vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total` during the policy's
run; TTFT comes from the load generator. Everything stops by itself at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
POLICIES = ("cache_aware", "round_robin")


def free_port_pair() -> int:
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            base = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", base + 1))
                    return int(base)
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prefix_cache(urls: list[str]) -> tuple[float, float]:
    """(hits, queries) summed over the servers' /metrics."""
    hits = queries = 0.0
    for url in urls:
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            name, _, _ = line.partition("{") if "{" in line else line.partition(" ")
            if name == "vllm:prefix_cache_hits_total":
                hits += float(line.rsplit(" ", 1)[1])
            elif name == "vllm:prefix_cache_queries_total":
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


@contextlib.contextmanager
def vllm_servers(run_dir: Path) -> Iterator[list[str]]:
    env = {**os.environ, "VLLM_CPU_RUN": str(run_dir)}
    subprocess.run([HERE / "setup.sh"], check=True, env=env)
    base = free_port_pair()
    subprocess.run([HERE / "serve.sh", "start", "2", str(base)], check=True, env=env)
    try:
        yield [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
    finally:
        subprocess.run([HERE / "serve.sh", "stop"], check=False, env=env)


@contextlib.contextmanager
def gateway(policy: str, backends: list[str], work: Path) -> Iterator[str]:
    cfg = work / f"{policy}.yaml"
    cfg.write_text(
        "models:\n  - name: tiny\n    backends: ["
        + ", ".join(f"{{url: '{b}'}}" for b in backends)
        + f"]\nrouting: {{policy: {policy}}}\n"
        f"database: {{url: 'sqlite:///{work}/{policy}.db'}}\n"
        f"ledger: {{spool_dir: '{work}/spool-{policy}'}}\n"
        "upstream: {health_timeout: 10}\n"
        "server: {access_log: false}\n"
    )
    port = free_port()
    log = (work / f"{policy}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", str(port)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {(work / f'{policy}.log').read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


def bench(url: str, policy: str, args: argparse.Namespace, out: Path) -> dict[str, object]:
    subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "run", "--base-url", url + "/v1",
         "--label", policy, "--model", "tiny", "--workload", "multi-turn",
         "--conversations", str(args.conversations), "--turns", str(args.turns),
         "--max-tokens", "32", "--concurrency", str(args.concurrency),
         "--requests", str(args.requests), "--salt", f"{policy}-{time.time_ns()}",
         "--no-progress", "--json", str(out)],
        cwd=ROOT, check=True, timeout=1800,
    )  # fmt: skip
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gw-vllm-routing-"))
    rows = []
    with vllm_servers(work / "run") as servers:
        for policy in POLICIES:
            with gateway(policy, servers, work) as url:
                before = prefix_cache(servers)
                report = bench(url, policy, args, work / f"{policy}.json")
                after = prefix_cache(servers)
            hits, queries = after[0] - before[0], after[1] - before[1]
            rows.append({
                "policy": policy,
                "vllm_hit_ratio": hits / queries if queries else None,
                "reported_hit_ratio": report["hit_ratio"],
                "ttft_ms": report["ttft_ms"],
                "requests": report["ok"],
                "errors": report["errors"],
                "instances": report["instances"],
            })  # fmt: skip
    print("| policy | vLLM prefix-cache hit ratio | cached/prompt | TTFT p50 ms | TTFT p99 ms "
          "| requests per backend |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        ttft = r["ttft_ms"]
        assert isinstance(ttft, dict)
        print(f"| {r['policy']} | {r['vllm_hit_ratio']:.3f} | {r['reported_hit_ratio']:.3f} "
              f"| {ttft['p50']:.1f} | {ttft['p99']:.1f} | {r['instances']} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
