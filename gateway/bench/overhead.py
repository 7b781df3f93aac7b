"""Proxy overhead, side by side: the gateway against peers in front of one instant simulator.

    python -m gateway.bench.overhead [--litellm BIN] [--vllm-router BIN] [--duration S]

Starts `gateway sim --instant`, the gateway in front of it, and optionally the LiteLLM
proxy and vllm-router in front of the same simulator; then drives each with `wrk`
(non-streaming chat, concurrency 1, 16 and 64) in interleaved rounds, so every target
sees the same machine at the same moments, and measures streaming time to first byte
with a sequential client. Added latency is each target's p50 minus the direct p50.
Everything listens on 127.0.0.1 and every run is bounded by --duration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx

MODEL = "sim-model"
KEY = "sk-3f9c2a7e5b1d4068a9e7c3b2f1d0e4a5b6c7d8e9f0a1b2c3"
"""Sent to every target; LiteLLM's proxy refuses to start without a strong master key."""
CHAT = (
    f'{{"model":"{MODEL}","messages":[{{"role":"user","content":"Say hello in a few words."}}],'
    '"max_tokens":8}'
)
LUA = f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {KEY}"
wrk.body = '{CHAT}'
"""


@dataclass
class Target:
    name: str
    base: str
    """Base URL including /v1."""
    rps: dict[int, list[float]] = field(default_factory=dict)
    p50_ms: dict[int, list[float]] = field(default_factory=dict)
    ttfb_ms: list[float] = field(default_factory=list)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process(
    cmd: list[str],
    ready_url: str,
    log: Path,
    timeout: float = 90,
    env: dict[str, str] | None = None,
    own_session: bool = False,
) -> Iterator[subprocess.Popen[bytes]]:
    """cmd running until the context exits, once ready_url answers; ``own_session``: in a
    session of its own, which Linux's autogroup scheduler gives a CPU share of its own
    (otherwise every process of the benchmark splits the share of the session that ran it)."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=own_session)  # fmt: skip
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"{cmd[0]} exited: {log.read_text()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(ready_url, timeout=1).status_code < 500:
                        break
                time.sleep(0.2)
            else:
                raise RuntimeError(f"{cmd} did not come up within {timeout} s")
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def vllm_router(
    binary: str, sim: str, log: Path, own_session: bool = False
) -> Iterator[tuple[str, int]]:
    """vllm-router in front of the simulator at sim (round robin): its URL and pid."""
    port = free_port()
    with process(
        [binary, "--worker-urls", sim, "--policy", "round_robin", "--host", "127.0.0.1",
         "--port", str(port), "--prometheus-port", str(free_port())],
        f"http://127.0.0.1:{port}/health", log, own_session=own_session,
    ) as proc:  # fmt: skip
        yield f"http://127.0.0.1:{port}", proc.pid


def wrk(url: str, lua: Path, connections: int, seconds: float) -> tuple[float, float]:
    """Requests/s and p50 latency (ms) from one wrk run."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{round(seconds)}s", "--latency",
         "-s", str(lua), url],
        capture_output=True, text=True, check=True, timeout=seconds + 30,
    ).stdout  # fmt: skip
    if re.search(r"Non-2xx or 3xx responses: \d+", out):
        raise RuntimeError(f"errors from {url}:\n{out}")
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert rate is not None, out
    rps = float(rate.group(1))
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)\b", out)
    assert p50 is not None, out
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p50.group(2)]
    return rps, float(p50.group(1)) * scale


async def ttfb(base: str, n: int) -> list[float]:
    """Time to the first body byte of a streamed chat call, sequentially, in ms."""
    body = CHAT[:-1] + ',"stream":true}'
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    out: list[float] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            t0 = time.perf_counter()
            async with session.post(base + "/chat/completions", data=body, headers=headers) as r:
                await r.content.readany()
                out.append((time.perf_counter() - t0) * 1000)
                await r.read()
    return out


def run(args: argparse.Namespace) -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk")
    tmp = Path(tempfile.mkdtemp(prefix="gw-overhead-"))
    lua = tmp / "chat.lua"
    lua.write_text(LUA)
    sim_port, gw_port = free_port(), free_port()
    sim = f"http://127.0.0.1:{sim_port}"
    py = sys.executable
    targets = [Target("direct", sim + "/v1"), Target("gateway", f"http://127.0.0.1:{gw_port}/v1")]
    cfg = tmp / "gateway.yaml"
    cfg.write_text(
        f"models:\n  - name: {MODEL}\n    backends: [{{url: '{sim}'}}]\n"
        f"database: {{url: 'sqlite:///{tmp}/ledger.db'}}\nledger: {{spool_dir: '{tmp}/spool'}}\n"
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(process(
            [py, "-m", "gateway", "sim", "--instant", "--port", str(sim_port)],
            sim + "/health", tmp / "sim.log"))  # fmt: skip
        stack.enter_context(process(
            [py, "-m", "gateway", "serve", "--config", str(cfg), "--port", str(gw_port),
             "--workers", str(args.workers)],
            targets[1].base.removesuffix("/v1") + "/health", tmp / "gateway.log"))  # fmt: skip
        if args.litellm:
            port = free_port()
            lcfg = tmp / "litellm.yaml"
            lcfg.write_text(
                f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n"
                f"      model: openai/{MODEL}\n      api_base: {sim}/v1\n      api_key: none\n"
            )
            # The local cost map: no attempt to fetch it from the network at start.
            env = {**os.environ, "LITELLM_MASTER_KEY": KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
            stack.enter_context(process(
                [args.litellm, "--config", str(lcfg), "--port", str(port),
                 "--host", "127.0.0.1"],
                f"http://127.0.0.1:{port}/health/liveliness", tmp / "litellm.log",
                180, env))  # fmt: skip
            targets.append(Target("litellm", f"http://127.0.0.1:{port}/v1"))
        if args.vllm_router:
            url, _ = stack.enter_context(
                vllm_router(args.vllm_router, sim, tmp / "vllm-router.log")
            )
            targets.append(Target("vllm-router", url + "/v1"))
        for t in targets:  # warm up, and prove each answers a real call
            r = httpx.post(t.base + "/chat/completions", content=CHAT, timeout=30,
                           headers={"content-type": "application/json",
                                    "authorization": f"Bearer {KEY}"})  # fmt: skip
            r.raise_for_status()
            wrk(t.base + "/chat/completions", lua, 16, 2)
        for round_ in range(args.rounds):
            for c in (1, 16, 64):
                for t in targets:
                    rps, p50 = wrk(t.base + "/chat/completions", lua, c, args.duration)
                    t.rps.setdefault(c, []).append(rps)
                    t.p50_ms.setdefault(c, []).append(p50)
            for t in targets:
                t.ttfb_ms += asyncio.run(ttfb(t.base, args.ttfb_calls))
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    report(targets)


def report(targets: list[Target]) -> None:
    direct = targets[0]
    med = statistics.median
    d_ttfb = med(direct.ttfb_ms)
    print("| target | rps c=1 | rps c=16 | rps c=64 | p50 ms c=1 | added p50 ms c=1 "
          "| stream TTFB p50 ms | added TTFB ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for t in targets:
        p50 = med(t.p50_ms[1])
        print(
            f"| {t.name} | {med(t.rps[1]):,.0f} | {med(t.rps[16]):,.0f} | {med(t.rps[64]):,.0f} "
            f"| {p50:.3f} | {p50 - med(direct.p50_ms[1]):.3f} | {med(t.ttfb_ms):.3f} "
            f"| {med(t.ttfb_ms) - d_ttfb:.3f} |"
        )
    by = {t.name: t for t in targets}
    gw = by["gateway"]
    for peer in ("litellm", "vllm-router"):
        if peer in by:
            ratio = med(gw.rps[16]) / med(by[peer].rps[16])
            print(f"gateway / {peer} requests/s at c=16: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--litellm", help="path of the `litellm` proxy command (own venv)")
    parser.add_argument("--vllm-router", help="path of the `vllm-router` command")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes")
    parser.add_argument("--ttfb-calls", type=int, default=200)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
