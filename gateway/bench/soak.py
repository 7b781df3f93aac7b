"""Memory over a long run: the gateway's RSS and Python heap beside vllm-router's.

    python -m gateway.bench.soak --calls 1000000 --vllm-router BIN \\
        --database-url postgresql://postgres@127.0.0.1:5432/test --redis-url redis://127.0.0.1:6379

Production shape: one gateway worker with a Postgres ledger (a scratch database created
next to the one named, dropped at the end), Redis (a key prefix of its own, deleted at
the end), API keys on (``--keys`` of them, with rate limits and budgets that never
refuse), in front of an instant simulator; vllm-router in front of another (one shared
simulator, a single Python process, would serve whichever target asks faster, and the
Rust router asks several times faster: the gateway's calls would wait on the router's).
Both are driven at once by ``wrk`` with the same mixed calls: streamed and not, system
prompts of 20, 300 and 1,500 words, up to three earlier turns, a new question every call,
8-64 output tokens, the keys in turn. Every ``--round`` seconds it samples each process's
RSS and the gateway's ``gateway_python_allocated_blocks``, and stops once each target
has served ``--calls`` (or after ``--max-minutes``). It then prints the samples and,
per target, RSS right after start, after the warm-up (``--warmup`` calls) and at the
end, with the growth after the warm-up. The access log is off (a million lines to a
file measure the disk); everything listens on 127.0.0.1. Each process (servers,
simulators, each ``wrk``) runs in a session of its own: Linux's autogroup scheduler gives
each session one CPU share, and on a shared machine the gateway's calls would otherwise
wait for the router's, the simulators' and the load generators' turns within one share.
On a machine busy with other work one share may still be too small for a million calls
within the hour; weighting the gateway's session (``echo -8 > /proc/PID/autogroup``, as
root) is left to whoever runs it, and belongs beside the figures.

With ``--heap DIR`` the gateway runs with :mod:`gateway.bench.traced` beside it: a heap
report (objects left after calls by type, cache sizes, gc statistics) after the warm-up,
each ``--heap-every`` calls after it and at the end, the last compared with the first.
``--tracemalloc`` adds allocation sites, compared from the second report (the first
starts tracing); tracing costs the gateway most of its speed, so such a run finds where
memory goes and measures nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import FrameType

import httpx

from gateway.bench import traced
from gateway.bench.overhead import free_port, process, vllm_router

MODEL = "sim-model"
PEPPER = "soak-pepper"

LUA = """-- mixed app-shaped chat calls; args: comma-separated API keys (may be empty), and
-- the number of the first call (each wrk run goes on from the calls before it, so every
-- question is new: a run that began at 0 would ask the same questions each round)
local keys, systems, n = {}, {}, 0
local function words(count, seed)
  local t = {}
  for i = 1, count do t[i] = "w" .. ((i * seed) % 997) end
  return table.concat(t, " ")
end
function init(args)
  for k in string.gmatch(args[1] or "", "[^,]+") do keys[#keys + 1] = k end
  n = tonumber(args[2] or "0")
  systems = { words(20, 3), words(300, 7), words(1500, 11) }
end
function request()
  n = n + 1
  local msgs = { '{"role":"system","content":"' .. systems[n % 3 + 1] .. '"}' }
  for t = 1, math.floor(n / 3) % 4 do
    msgs[#msgs + 1] = '{"role":"user","content":"earlier question ' .. t .. ' of talk '
      .. (n % 500) .. '"}'
    msgs[#msgs + 1] = '{"role":"assistant","content":"an earlier answer ' .. t .. '"}'
  end
  msgs[#msgs + 1] = '{"role":"user","content":"question ' .. n .. ': what is ' .. n
    .. ' times two?"}'
  local stream = (n % 5 < 2) and '"stream":true,' or ''
  local body = '{"model":"sim-model","max_tokens":' .. (8 + n % 57) .. ',' .. stream
    .. '"messages":[' .. table.concat(msgs, ",") .. ']}'
  local headers = { ["Content-Type"] = "application/json" }
  if #keys > 0 then headers["Authorization"] = "Bearer " .. keys[n % #keys + 1] end
  return wrk.format("POST", nil, headers, body)
end
"""


@dataclass
class Target:
    name: str
    url: str
    pid: int
    keys: list[str]
    calls: int = 0
    errors: int = 0
    samples: list[tuple[float, int, float, int | None]] = field(default_factory=list)
    """(minutes, calls, RSS MB, Python heap blocks or None)."""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def heap_blocks(base: str) -> int | None:
    try:
        text = httpx.get(base + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^gateway_python_allocated_blocks(?:\{[^}]*\})? ([\d.e+]+)$", text, re.M)
    return int(float(m.group(1))) if m else None


def wrk_round(t: Target, lua: Path, connections: int, seconds: int) -> None:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(lua), t.url, "--",
         ",".join(t.keys), str(t.calls + t.errors)],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
        start_new_session=True,
    ).stdout  # fmt: skip
    done = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    t.calls += int(done.group(1)) if done else 0
    t.errors += int(bad.group(1)) if bad else 0


@contextlib.contextmanager
def scratch_database(base_url: str) -> Iterator[str]:
    """A new database on the server of base_url, dropped afterwards."""
    import asyncpg

    name = f"gw_soak_{uuid.uuid4().hex[:8]}"
    admin = base_url.replace("postgresql://", "postgres://", 1)

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    try:
        yield base_url.rsplit("/", 1)[0] + "/" + name
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def make_keys(url: str, count: int) -> list[str]:
    """Keys with limits and budgets far above what the run spends (the checks still run)."""
    from gateway.keys import store
    from gateway.keys.specs import KeySpec, TeamSpec
    from gateway.ledger.db import make_engine
    from gateway.ledger.migrate import upgrade

    engine = make_engine(url)
    try:
        await upgrade(engine)
        now = datetime.now(UTC)
        for team in ("soak-a", "soak-b"):
            await store.create_team(engine, TeamSpec(name=team, rpm=10**7, tpm=10**9,
                                    budget_usd=Decimal(10**6)), now)  # fmt: skip
        secrets = []
        for i in range(count):
            spec = KeySpec(team=("soak-a", "soak-b")[i % 2], rpm=10**7, tpm=10**9,
                           budget_usd=Decimal(10**6))  # fmt: skip
            secrets.append((await store.create_key(engine, spec, PEPPER, now))[1])
        return secrets
    finally:
        await engine.dispose()


def delete_prefix(redis_url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


def gateway_config(tmp: Path, sim: str, db: str, redis_url: str, prefix: str) -> Path:
    cfg = tmp / "gateway.yaml"
    cfg.write_text(
        f"models:\n  - name: {MODEL}\n    backends: [{{url: '{sim}'}}]\n"
        "    price: {input: '0.15', cached_input: '0.075', output: '0.60'}\n"
        f"database: {{url: '{db}'}}\nledger: {{spool_dir: '{tmp}/spool'}}\n"
        f"redis: {{url: '{redis_url}', key_prefix: '{prefix}'}}\n"
        f"auth: {{enabled: true, pepper: {PEPPER}}}\n"
        "server: {access_log: false}\n"
    )
    return cfg


@contextlib.contextmanager
def simulator(log: Path) -> Iterator[str]:
    """An instant simulator of its own: its URL."""
    url = f"http://127.0.0.1:{free_port()}"
    with process([sys.executable, "-m", "gateway", "sim", "--instant", "--port",
                  url.rsplit(":", 1)[1]], url + "/health", log, own_session=True):  # fmt: skip
        yield url


def sample(targets: list[Target], started: float) -> None:
    for t in targets:
        heap = heap_blocks(t.url.rsplit("/v1", 1)[0]) if t.name == "gateway" else None
        t.samples.append(((time.monotonic() - started) / 60, t.calls, rss_mb(t.pid), heap))


class HeapReports:
    """Asks the gateway for heap reports (SIGUSR1): after the warm-up, every ``every``
    calls after it and at the end; then prints what grew from the first (the second when
    tracing: the first starts it) to the last."""

    def __init__(
        self, pid: int, directory: Path | None, warmup: int, every: int, tracing: bool
    ) -> None:
        self._pid, self._dir, self._every = pid, directory, every
        self._next, self._taken, self._first = warmup, 0, 1 + tracing

    def maybe(self, calls: int) -> None:
        if self._dir is not None and calls >= self._next:
            self._take()
            self._next = calls + self._every

    def finish(self) -> None:
        if self._dir is None or not self._taken:
            return
        self._take()
        first = min(self._first, self._taken - 1)
        traced.compare(self._dir / f"{first:03d}", self._dir / f"{self._taken:03d}")

    def _take(self) -> None:
        assert self._dir is not None
        self._taken += 1
        os.kill(self._pid, signal.SIGUSR1)
        done = self._dir / f"{self._taken:03d}.json"
        deadline = time.monotonic() + 600
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(1)


def run(args: argparse.Namespace) -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk")
    tmp = Path(tempfile.mkdtemp(prefix="gw-soak-"))
    lua = tmp / "soak.lua"
    lua.write_text(LUA)
    gw_port = free_port()
    prefix = f"gw-soak-{uuid.uuid4().hex[:8]}:"
    py = sys.executable
    with contextlib.ExitStack() as stack:
        db = stack.enter_context(scratch_database(args.database_url))
        stack.callback(delete_prefix, args.redis_url, prefix)
        keys = asyncio.run(make_keys(db, args.keys))
        cfg = gateway_config(tmp, stack.enter_context(simulator(tmp / "sim.log")), db,
                             args.redis_url, prefix)  # fmt: skip
        tracer = [py, "-m", "gateway.bench.traced", str(args.heap)] if args.heap else []
        tracer += ["--tracemalloc"] if tracer and args.tracemalloc else []
        gw = stack.enter_context(process(
            [*(tracer or [py, "-m", "gateway"]), "serve", "--config", str(cfg),
             "--port", str(gw_port)], f"http://127.0.0.1:{gw_port}/health",
            tmp / "gateway.log", own_session=True))  # fmt: skip
        targets = [Target("gateway", f"http://127.0.0.1:{gw_port}/v1/chat/completions",
                          gw.pid, keys)]  # fmt: skip
        if args.vllm_router:
            sim = stack.enter_context(simulator(tmp / "router-sim.log"))
            url, pid = stack.enter_context(
                vllm_router(args.vllm_router, sim, tmp / "router.log", own_session=True)
            )
            targets.append(Target("vllm-router", url + "/v1/chat/completions", pid, []))
        started = time.monotonic()
        for t in targets:  # one call each proves the path; RSS "at start" is after it
            r = httpx.post(t.url, json={"model": MODEL, "max_tokens": 4, "messages": [
                {"role": "user", "content": "hello"}]}, timeout=30,
                headers={"authorization": f"Bearer {keys[0]}"})  # fmt: skip
            r.raise_for_status()
        sample(targets, started)
        heap = HeapReports(gw.pid, args.heap, args.warmup, args.heap_every, args.tracemalloc)
        deadline = started + args.max_minutes * 60
        while time.monotonic() < deadline and any(t.calls < args.calls for t in targets):
            threads = [threading.Thread(target=wrk_round, args=(t, lua, args.connections,
                       args.round)) for t in targets if t.calls < args.calls]  # fmt: skip
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            sample(targets, started)
            heap.maybe(targets[0].calls)
            print(" | ".join(f"{t.name} {t.calls:,} calls ({t.errors} non-2xx) "
                             f"{t.samples[-1][2]:.1f} MB" for t in targets),
                  file=sys.stderr, flush=True)  # fmt: skip
        heap.finish()
    report(targets, args.warmup)


def report(targets: list[Target], warmup: int) -> None:
    for t in targets:
        print(f"\n{t.name} ({t.errors} non-2xx)")
        print("| minutes | calls | RSS MB | Python heap blocks |")
        print("|---|---|---|---|")
        for minutes, calls, rss, heap in t.samples:
            print(f"| {minutes:.1f} | {calls:,} | {rss:.1f} | {heap if heap is not None else ''} |")
    print("\n| target | calls | RSS at start | RSS after warm-up | RSS at end "
          "| growth after warm-up | end / start |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for t in targets:
        start, end = t.samples[0][2], t.samples[-1][2]
        warm = next((s for s in t.samples if s[1] >= warmup), t.samples[-1])[2]
        print(
            f"| {t.name} | {t.calls:,} | {start:.1f} | {warm:.1f} | {end:.1f} "
            f"| {100 * (end - warm) / warm:+.1f}% | {end / start:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000, help="per target")
    parser.add_argument("--warmup", type=int, default=50_000, help="calls before steady state")
    parser.add_argument("--max-minutes", type=float, default=30, help="stop after this anyway")
    parser.add_argument("--round", type=int, default=15, help="seconds between samples")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections each")
    parser.add_argument("--keys", type=int, default=8)
    parser.add_argument("--heap", type=Path, help="take heap reports into this directory")
    parser.add_argument("--heap-every", type=int, default=100_000,
                        help="calls between heap reports after the warm-up")  # fmt: skip
    parser.add_argument("--tracemalloc", action="store_true",
                        help="with --heap: trace allocations too (slow)")  # fmt: skip
    parser.add_argument("--vllm-router", help="path of the `vllm-router` command")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="a Postgres server (its database is left alone)")  # fmt: skip
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    signal.signal(signal.SIGTERM, stop)
    run(parser.parse_args())


def stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM stops the run as Ctrl-C does: its processes, database and keys go too."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
