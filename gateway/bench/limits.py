"""`gateway bench limits`: does one key's shared rate limit hold across replicas under load?

    gateway bench limits --replicas 2 --clients 16 --seconds 20 --rpm 60 --runs 5

Starts on loopback one instant simulator and REPLICAS `gateway serve` processes sharing
Redis (under a private key prefix, deleted afterwards) and a Postgres database of their
own (created on the server of --database-url, dropped afterwards). Each run creates a
fresh key of RPM requests a minute and loads every replica with CLIENTS closed-loop
clients (one client process per replica) for SECONDS; then it counts the calls served
(200) and refused (429). A key's bucket admits its full minute at once and then one call
every 60/RPM s (GCRA, limits/base.py), so a run may serve at most
RPM + floor(window * RPM / 60) calls, the window running from the first call sent to the
last answer received; a run above that fails the bench (exit status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.bench.overhead import free_port, process
from gateway.ledger.bench import scratch_database

BODY = {
    "model": "sim-model",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "What is a token bucket?"},
    ],
    "max_tokens": 8,
}
ADMIN = "bench-admin"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--clients", type=int, default=16, help="concurrent clients per replica")
    p.add_argument("--seconds", type=float, default=20.0, help="load per run")
    p.add_argument("--rpm", type=int, default=60, help="the key's requests per minute")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument(
        "--database-url",
        default="postgresql://127.0.0.1:5432/test",
        help="a Postgres server to create the bench's own database on",
    )


@dataclass(frozen=True, slots=True)
class Load:
    replicas: int
    clients: int
    """Concurrent closed-loop clients per replica."""
    seconds: float
    rpm: int
    """The key's requests per minute."""
    runs: int


@dataclass(frozen=True, slots=True)
class Run:
    served: int
    refused: int
    other: int
    """Answers neither 200 nor 429, and calls that got no answer."""
    window: float
    rpm: int

    @property
    def allowed(self) -> int:
        """What GCRA admits to a fresh key of ``rpm`` in ``window`` seconds."""
        return self.rpm + math.floor(self.window * self.rpm / 60)

    @property
    def held(self) -> bool:
        return self.served <= self.allowed


def run(args: argparse.Namespace) -> int:
    load = Load(args.replicas, args.clients, args.seconds, args.rpm, args.runs)
    runs = bench(load, args.redis_url, args.database_url)
    print(f"{args.replicas} replicas x {args.clients} clients, {args.seconds:g} s, rpm {args.rpm}")
    print("run  served  allowed  refused  other  window_s")
    for i, r in enumerate(runs, 1):
        counts = f"{r.served:>6}  {r.allowed:>7}  {r.refused:>7}  {r.other:>5}"
        print(f"{i:>3}  {counts}  {r.window:8.2f}")
    held = sum(r.held for r in runs)
    print(f"within the limit: {held} of {len(runs)} runs")
    return 0 if held == len(runs) else 1


def bench(load: Load, redis_url: str, database_url: str) -> list[Run]:
    """Start the replicas, then run the load ``load.runs`` times, a fresh key each time."""
    return asyncio.run(_bench(load, redis_url, database_url))


async def _bench(load: Load, redis_url: str, database_url: str) -> list[Run]:
    """(Blocking inside: the loop only holds the scratch database's admin connection.)"""
    async with scratch_database(database_url) as db:
        with (
            tempfile.TemporaryDirectory(prefix="gw-bench-limits-") as tmp,
            scratch_redis_prefix(redis_url, "gwbench:limits") as prefix,
            _cluster(Path(tmp), load.replicas, redis_url, prefix, db) as urls,
        ):
            _create_team(urls[0])
            return [_one_run(urls, load) for _ in range(load.runs)]


def _one_run(urls: list[str], load: Load) -> Run:
    key = _create_key(urls[0], load.rpm)
    args = [key, str(load.clients), str(load.seconds)]
    cmd = [sys.executable, "-m", "gateway.bench.limits"]
    loads = [subprocess.Popen([*cmd, url, *args], stdout=subprocess.PIPE) for url in urls]
    outs = [json.loads(p.communicate(timeout=load.seconds + 120)[0]) for p in loads]
    window = max(o["last"] for o in outs) - min(o["first"] for o in outs)
    return Run(
        served=sum(o["served"] for o in outs),
        refused=sum(o["refused"] for o in outs),
        other=sum(o["other"] for o in outs),
        window=window,
        rpm=load.rpm,
    )


async def _load(url: str, key: str, clients: int, seconds: float) -> dict[str, float]:
    """CLIENTS closed loops on one replica for SECONDS; counts by status, and the wall
    times of the first call sent and the last answer received."""
    counts = {"served": 0, "refused": 0, "other": 0}
    first = time.time()
    last = first
    stop = time.monotonic() + seconds
    headers = {"authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30) as c:

        async def client() -> None:
            nonlocal last
            while time.monotonic() < stop:
                try:
                    status = (await c.post("/v1/chat/completions", json=BODY)).status_code
                except httpx.HTTPError:
                    status = 0
                last = max(last, time.time())
                kind = {200: "served", 429: "refused"}.get(status, "other")
                counts[kind] += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return {**counts, "first": first, "last": last}


def _create_team(url: str) -> None:
    r = httpx.post(f"{url}/admin/teams", json={"name": "bench"}, headers=_admin(), timeout=30)
    r.raise_for_status()


def _create_key(url: str, rpm: int) -> str:
    body = {"team": "bench", "rpm": rpm}
    r = httpx.post(f"{url}/admin/keys", json=body, headers=_admin(), timeout=30)
    r.raise_for_status()
    return str(r.json()["key"])


def _admin() -> dict[str, str]:
    return {"authorization": f"Bearer {ADMIN}"}


@contextlib.contextmanager
def scratch_redis_prefix(url: str, owner: str) -> Iterator[str]:
    """A key prefix of its own on a shared Redis (owner:random:); its keys are deleted
    afterwards."""
    import redis

    prefix = f"{owner}:{uuid.uuid4().hex[:10]}:"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@contextlib.contextmanager
def _cluster(tmp: Path, replicas: int, redis_url: str, prefix: str, db: str) -> Iterator[list[str]]:
    """One instant simulator and the replicas in front of it; yields the replicas' URLs."""
    gateway = [sys.executable, "-m", "gateway"]
    with contextlib.ExitStack() as stack:
        sim = free_port()
        cmd = [*gateway, "sim", "--instant", "--port", str(sim)]
        stack.enter_context(process(cmd, f"http://127.0.0.1:{sim}/health", tmp / "sim.log"))
        urls = []
        for i in range(replicas):
            config = tmp / f"replica{i}.yaml"
            config.write_text(_config(sim, redis_url, prefix, db, tmp / f"spool{i}"))
            url = f"http://127.0.0.1:{free_port()}"
            cmd = [*gateway, "serve", "--config", str(config), "--port", url.rpartition(":")[2]]
            stack.enter_context(process(cmd, f"{url}/health", tmp / f"replica{i}.log"))
            urls.append(url)
        yield urls


def _config(sim: int, redis_url: str, prefix: str, db: str, spool: Path) -> str:
    return json.dumps({  # YAML is a superset of JSON
        "server": {"access_log": False},
        "models": [{"name": "sim-model", "backends": [{"url": f"http://127.0.0.1:{sim}"}]}],
        "database": {"url": db, "auto_migrate": True},
        "ledger": {"spool_dir": str(spool)},
        "redis": {"url": redis_url, "key_prefix": prefix},
        "auth": {"enabled": True, "admin_key": ADMIN, "pepper": "bench"},
    })  # fmt: skip


if __name__ == "__main__":  # one replica's load: URL KEY CLIENTS SECONDS, JSON on stdout
    url, key, clients, seconds = sys.argv[1:]
    print(json.dumps(asyncio.run(_load(url, key, int(clients), float(seconds)))))
