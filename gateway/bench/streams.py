"""Memory per open stream: RSS with N slow streams open, the gateway beside vllm-router.

    python -m gateway.bench.streams --vllm-router BIN [--streams 100 1000 4000]

One simulator that paces its tokens (a decode step every ``--step-ms``, room for every
stream and its whole answer at once), the gateway (embedded defaults but for the backend:
SQLite ledger, in-process index, no keys) and vllm-router in front of it. For each N, in
rising order, it opens N streamed chat calls to each target at once, waits until every
one has received its first chunk, samples each target's RSS, then closes them all (the
targets cancel their upstream calls). The cost per open stream is (RSS with N open - RSS
before the first stream) / N. The gateway waits up to 30 s for a health probe: a Python
simulator streaming to 8,000 clients answers slowly, and this measures memory. Everything
listens on 127.0.0.1; the open-file limit is raised to its hard limit for the client and
the processes it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import aiohttp
import httpx

from gateway.bench.overhead import free_port, process, vllm_router
from gateway.bench.soak import MODEL, rss_mb

TOKENS = 600
OPENING = 256
"""Each stream's length: twenty minutes at the default step, longer than any level takes."""


async def hold(session: aiohttp.ClientSession, url: str, i: int, opened: asyncio.Event,
               count: list[int], n: int, stop: asyncio.Event,
               opening: asyncio.Semaphore) -> None:  # fmt: skip
    """One streamed call: count it open at its first chunk, keep reading until stop.
    Each prompt is its own, so the gateway coalesces none of them; ``opening`` bounds the
    calls on their way to a first chunk (thousands at once swamp the simulator)."""
    prompt = f"Tell me long story number {i}."
    body = {"model": MODEL, "stream": True, "max_tokens": TOKENS,
            "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        async with opening:
            resp = await stack.enter_async_context(session.post(url, json=body))
            resp.raise_for_status()
            await resp.content.readany()
        count[0] += 1
        if count[0] == n:
            opened.set()
        reading = asyncio.ensure_future(_drain(resp))
        try:
            await stop.wait()
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading


async def _drain(resp: aiohttp.ClientResponse) -> None:
    while await resp.content.readany():
        pass


async def _all_set(events: Iterable[asyncio.Event]) -> None:
    await asyncio.gather(*(e.wait() for e in events))


async def level(
    urls: dict[str, str], pids: dict[str, int], n: int, seconds: float
) -> dict[str, float]:
    """RSS (MB) of each target with n streams open to each."""
    connector = aiohttp.TCPConnector(limit=0)
    unbounded = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=unbounded) as session:
        stop = asyncio.Event()
        opened = {name: asyncio.Event() for name in urls}
        counts = {name: [0] for name in urls}
        opening = asyncio.Semaphore(OPENING)
        tasks = [
            asyncio.create_task(hold(session, url, i, opened[name], counts[name], n, stop, opening))
            for i in range(n)  # the targets in turn, so both open at the same pace
            for name, url in urls.items()
        ]
        try:
            all_open = asyncio.create_task(_all_set(opened.values()))
            done, _ = await asyncio.wait([all_open, *tasks], timeout=seconds,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            all_open.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await all_open
            for task in done:
                if task is not all_open:
                    task.result()  # a stream that failed or ended early: say why
                    raise RuntimeError("a stream ended before the level was measured")
            if not done:
                opened_by = {name: c[0] for name, c in counts.items()}
                raise TimeoutError(f"{n} streams did not all open within {seconds} s: {opened_by}")
            await asyncio.sleep(2)  # let buffers and tasks settle at their steady size
            return {name: rss_mb(pid) for name, pid in pids.items()}
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)


def run(args: argparse.Namespace) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = Path(tempfile.mkdtemp(prefix="gw-streams-"))
    sim_port, gw_port = free_port(), free_port()
    sim = f"http://127.0.0.1:{sim_port}"
    most = max(args.streams) * 2 + 10
    py = sys.executable
    cfg = tmp / "gateway.yaml"
    cfg.write_text(
        f"models:\n  - name: {MODEL}\n    backends: [{{url: '{sim}'}}]\n"
        f"database: {{url: 'sqlite:///{tmp}/ledger.db'}}\nledger: {{spool_dir: '{tmp}/spool'}}\n"
        f"upstream: {{max_connections: {most}, connect_timeout: 30, health_timeout: 30}}\n"
        "server: {access_log: false}\n"
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(process(
            [py, "-m", "gateway", "sim", "--port", str(sim_port), "--step-ms", str(args.step_ms),
             "--max-num-seqs", str(most), "--max-num-batched-tokens", str(most * 64),
             "--cache-blocks", str(most * (TOKENS // 16 + 4)), "--decode-seq-ms", "0"],
            sim + "/health", tmp / "sim.log"))  # fmt: skip
        gw = stack.enter_context(process(
            [py, "-m", "gateway", "serve", "--config", str(cfg), "--port", str(gw_port)],
            f"http://127.0.0.1:{gw_port}/health", tmp / "gateway.log"))  # fmt: skip
        urls = {"gateway": f"http://127.0.0.1:{gw_port}/v1/chat/completions"}
        pids = {"gateway": gw.pid}
        if args.vllm_router:
            url, pid = stack.enter_context(vllm_router(args.vllm_router, sim, tmp / "router.log"))
            urls["vllm-router"] = url + "/v1/chat/completions"
            pids["vllm-router"] = pid
        for url in urls.values():  # warm up: a few calls through every path first
            for _ in range(5):
                httpx.post(url, json={"model": MODEL, "max_tokens": 2, "messages": [
                    {"role": "user", "content": "hi"}]}, timeout=60).raise_for_status()  # fmt: skip
        time.sleep(2)
        idle = {name: rss_mb(pid) for name, pid in pids.items()}
        print("idle: " + ", ".join(f"{k} {v:.1f} MB" for k, v in idle.items()),
              file=sys.stderr, flush=True)  # fmt: skip
        rows = []
        for n in sorted(args.streams):
            rss = asyncio.run(level(urls, pids, n, args.open_within))
            rows.append((n, rss))
            print(f"{n} streams: " + ", ".join(f"{k} {v:.1f} MB" for k, v in rss.items()),
                  file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(3)
    report(idle, rows)


def report(idle: dict[str, float], rows: list[tuple[int, dict[str, float]]]) -> None:
    names = list(idle)
    print("| open streams | " + " | ".join(f"{n} RSS MB | {n} KB per stream" for n in names)
          + (" | gateway / vllm-router per stream |" if len(names) > 1 else " |"))  # fmt: skip
    print("|---" * (1 + 2 * len(names) + (len(names) > 1)) + "|")
    print(
        "| 0 | " + " | ".join(f"{idle[n]:.1f} | " for n in names) + (" |" if len(names) > 1 else "")
    )
    for count, rss in rows:
        per = {n: (rss[n] - idle[n]) * 1024 / count for n in names}
        cells = " | ".join(f"{rss[n]:.1f} | {per[n]:.1f}" for n in names)
        ratio = (f" | {per['gateway'] / per['vllm-router']:.2f}x"
                 if "vllm-router" in per and per["vllm-router"] > 0 else "")  # fmt: skip
        print(f"| {count:,} | {cells}{ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--step-ms", type=float, default=2000, help="simulator decode step")
    parser.add_argument("--open-within", type=float, default=300, help="seconds to open a level")
    parser.add_argument("--vllm-router", help="path of the `vllm-router` command")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
