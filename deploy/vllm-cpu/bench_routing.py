"""Routing in front of two real vLLM servers, judged by vLLM's own counters.

    python deploy/vllm-cpu/bench_routing.py [--requests N] [--concurrency C] [--port P]
                                            [--json FILE]

Prepares vLLM (deploy/vllm-cpu/setup.sh), starts two servers on loopback, each pinned to
its own core (VLLM_CPU_PIN=1: two CPU servers sharing cores stall each other, which is
not routing), then for each shape of the zoo (agents: one system prompt under every
conversation; multi-turn: conversations with a short shared system prompt) and each
router (the gateway's cache_aware, vllm-router's consistent hash of the conversation id
sent as x-session-id, the gateway's round robin) replays the same seeded calls through
the router. Every router sends the very same prompts (greedy answers, so the same
histories): before each, both servers' prefix caches are emptied (vLLM's development
endpoint `/reset_prefix_cache`, enabled here only), so no router finds another's prefixes
and the tokens each prefills differ by its placements alone, not by its prompts.

Placement is judged by what the servers count, not the client: the growth of
`vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total` (hit ratio),
`vllm:prompt_tokens_total` less the hits (prompt tokens actually prefilled) and
`vllm:request_success_total` per server (calls per server). Checks for the gateway: no
more tokens prefilled than consistent hashing, and the busier server within 1.3x of an
even share. TTFT is printed too, from the client; on a shared 2-core machine it says
more about the machine than about routing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from gateway.bench import cluster
from gateway.bench.client import Target
from gateway.bench.routers import ROUTERS, SETUPS, front_of
from gateway.bench.runner import Options, run
from gateway.bench.workloads import Agents, MultiTurn, Workload

HERE = Path(__file__).resolve().parent
MODEL = "tiny"
CONFIGS = ("gw-cache-aware", "vllm-consistent-hash", "gw-round-robin")
EVEN = 1.3
SHAPES: dict[str, Workload] = {
    # The zoo's agents and multi-turn shapes, shrunk to the tiny model's 4,096-token
    # context (its tokenizer spends ~1.5 tokens on a word of this vocabulary).
    "agents": Agents(
        system_words=(600, 600),
        live=12,
        turns_per_conversation=(2, 5),
        message_words=(16, 64),
        max_tokens=(16, 32),
    ),
    "multi-turn": MultiTurn(conversations=12, turns_per_conversation=4, max_tokens=32),
}
COUNTERS = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries", "vllm:prompt_tokens",
            "vllm:request_success")  # fmt: skip


@dataclass(slots=True)
class Row:
    shape: str
    config: str
    calls: int
    errors: dict[str, int]
    hit_ratio: float | None
    prefilled: int
    """Prompt tokens vLLM computed: prompt tokens less prefix-cache hits."""
    per_server: list[int]
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None

    @property
    def imbalance(self) -> float:
        mean = sum(self.per_server) / len(self.per_server)
        return max(self.per_server) / mean if mean else float("nan")


def free_port_pair() -> int:
    """Two consecutive free ports below the ephemeral range: vLLM binds them only after a
    minute or more of start-up, and an ephemeral port may be some client's by then."""
    for _ in range(200):
        base = random.randrange(20000, 30000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
                return base
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def counters(url: str) -> dict[str, float]:
    """This server's totals of COUNTERS (every label summed)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {name: sum(v for _, v in cluster.samples(text, name)) for name in COUNTERS}


@contextlib.contextmanager
def vllm_servers(run_dir: Path, port: int | None) -> Iterator[list[str]]:
    env = {**os.environ, "VLLM_CPU_RUN": str(run_dir), "VLLM_CPU_PIN": "1",
           "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
    subprocess.run([HERE / "setup.sh"], check=True, env=env)
    base = port or free_port_pair()
    try:
        subprocess.run([HERE / "serve.sh", "start", "2", str(base)], check=True, env=env)
        yield [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
    finally:
        subprocess.run([HERE / "serve.sh", "stop"], check=False, env=env)


async def forget(servers: list[str]) -> None:
    """Empty every server's prefix cache; vLLM refuses while a sequence still holds blocks
    (an aborted call may take a moment to leave), so retry for a while."""
    async with httpx.AsyncClient(timeout=10) as client:
        for url in servers:
            for _ in range(100):
                reply = await client.post(url + "/reset_prefix_cache")
                if reply.status_code == 200 and reply.json().get("success"):
                    break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"{url} would not empty its prefix cache")


async def measure(
    shape: str, config: str, servers: list[str], args: argparse.Namespace, work: Path
) -> Row:
    setup = SETUPS[config]
    logs = Path(tempfile.mkdtemp(prefix=f"{shape}-{config}-", dir=work))
    settings = {"upstream": {"health_timeout": 10}}
    opts = Options(model=MODEL, concurrency=args.concurrency, requests=args.requests,
                   seed=args.seed, session_header=setup.session_header, timeout=600,
                   salt=f"{shape}-{args.seed} ")  # fmt: skip
    await forget(servers)
    async with front_of(setup, servers, logs, args.routers, settings, MODEL) as front:
        before = [counters(u) for u in servers]
        report = await run(SHAPES[shape], Target(f"{front.url}/v1", config), opts)
        after = [counters(u) for u in servers]
    grown = [{k: a[k] - b[k] for k in COUNTERS} for a, b in zip(after, before, strict=True)]
    hits = sum(g["vllm:prefix_cache_hits"] for g in grown)
    queries = sum(g["vllm:prefix_cache_queries"] for g in grown)
    prompt = sum(g["vllm:prompt_tokens"] for g in grown)
    return Row(shape=shape, config=config, calls=report.ok, errors=report.errors,
               hit_ratio=hits / queries if queries else None, prefilled=int(prompt - hits),
               per_server=[int(g["vllm:request_success"]) for g in grown],
               ttft_p50_ms=report.ttft_ms["p50"],
               ttft_p99_ms=report.ttft_ms["p99"])  # fmt: skip


def checks(rows: list[Row]) -> list[str]:
    lines = []
    for shape in SHAPES:
        mine = {r.config: r for r in rows if r.shape == shape}
        gw, ch = mine.get("gw-cache-aware"), mine.get("vllm-consistent-hash")
        if gw is None:
            continue
        if ch is not None:
            ok = gw.prefilled <= ch.prefilled
            lines.append(f"{shape}: prefilled {gw.prefilled} <= consistent hash "
                         f"{ch.prefilled}: {'met' if ok else 'MISSED'}")  # fmt: skip
        ok = gw.imbalance <= EVEN
        lines.append(f"{shape}: calls per server {gw.per_server}, busiest {gw.imbalance:.2f}x "
                     f"even <= {EVEN}: {'met' if ok else 'MISSED'}")  # fmt: skip
    return lines


def table(rows: list[Row]) -> str:
    lines = ["| shape | router | vLLM hit ratio | prompt tokens prefilled | calls per server "
             "| TTFT p50 / p99 ms |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        hit = "-" if r.hit_ratio is None else f"{r.hit_ratio:.3f}"
        p50, p99 = (f"{v:.0f}" if v is not None else "-" for v in (r.ttft_p50_ms, r.ttft_p99_ms))
        errors = f" (errors {r.errors})" if r.errors else ""
        lines.append(f"| {r.shape} | {r.config} | {hit} | {r.prefilled:,} | "
                     f"{' / '.join(map(str, r.per_server))}{errors} | {p50} / {p99} |")  # fmt: skip
    return "\n".join(lines)


async def campaign(servers: list[str], args: argparse.Namespace, work: Path) -> list[Row]:
    rows = []
    for shape in args.shapes:
        for config in args.configs:
            row = await measure(shape, config, servers, args, work)
            print(table([row]).splitlines()[-1], flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--configs", nargs="+", choices=list(SETUPS), default=list(CONFIGS))
    parser.add_argument("--requests", type=int, default=96, help="calls per shape and router")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--routers", type=Path, default=ROUTERS, help="dir of vllm-router")
    parser.add_argument("--port", type=int, help="the servers' first port (they take two)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gw-vllm-routing-"))
    with vllm_servers(work / "run", args.port) as servers:
        rows = asyncio.run(campaign(servers, args, work))
    print(table(rows))
    print("\n".join(checks(rows)))
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "imbalance": r.imbalance} for r in rows],
                                        indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
