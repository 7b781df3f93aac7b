"""Processes for the routing benchmark: a simulated cluster and the router in front of it.

Every piece is a subprocess with its output in a log file (a chatty process must never
block on a full pipe), started, polled until it answers, and stopped with SIGTERM
(SIGKILL after a grace period) when its context exits, even when the run failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp

STOP_GRACE = 10.0
READY_TIMEOUT = 180.0
"""Seconds a process gets to answer: on a small machine shared with other work, starting
a gateway (imports, tokenizer, first probes) can take over a minute."""


class StartFailed(Exception):
    """A process exited or never answered; the message carries the end of its log."""


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive loopback ports that are free right now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + count < 65536 and all(_free(base + i) for i in range(1, count)):
            return base
    raise StartFailed(f"no {count} consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.asynccontextmanager
async def process(
    name: str, cmd: Sequence[str], ready_url: str, logs: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run cmd until the context exits; yields once ready_url answers 2xx."""
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
        try:
            await wait_ready(ready_url, proc, log)
            yield proc
        finally:
            await stop(proc)


async def wait_ready(url: str, proc: asyncio.subprocess.Process, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise StartFailed(f"{log.stem} exited with {proc.returncode}:\n{tail(log)}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as resp:
                    if resp.status < 300:
                        return
            await asyncio.sleep(0.1)
    raise StartFailed(f"{url} did not answer within {READY_TIMEOUT:g} s:\n{tail(log)}")


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.asynccontextmanager
async def simulators(
    instances: int, cache_blocks: int, logs: Path, *options: str
) -> AsyncIterator[list[str]]:
    """A fresh simulated cluster (one process, consecutive ports); yields the base URLs.

    options: more `gateway sim` options (``--speed 1,1,1,0.5``, ``--max-num-seqs 8``)."""
    port = free_ports(instances)
    cmd = [sys.executable, "-m", "gateway", "sim", "--instances", str(instances),
           "--port", str(port), "--cache-blocks", str(cache_blocks), *options]  # fmt: skip
    urls = [f"http://127.0.0.1:{port + i}" for i in range(instances)]
    async with process("sim", cmd, f"{urls[-1]}/health", logs):
        yield urls


async def totals(urls: Sequence[str], *metrics: str) -> list[dict[str, float]]:
    """Per metric, each instance's counter (summed over its labels), read from its own
    /metrics in one scrape per instance."""
    out: list[dict[str, float]] = [{} for _ in metrics]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for url in urls:
            async with session.get(f"{url}/metrics") as resp:
                text = await resp.text()
            name = "sim-" + url.rsplit(":", 1)[1]
            for found, metric in zip(out, metrics, strict=True):
                found[name] = sum(value for _, value in samples(text, metric))
    return out


def samples(text: str, metric: str) -> list[tuple[str, float]]:
    """(labels, value) of each sample of a counter in Prometheus text (``_total`` optional)."""
    out = []
    for line in text.splitlines():
        if not line.startswith(metric) or line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        if name not in (metric, metric + "_total"):
            continue
        labels, _, value = rest.rpartition("}")
        out.append((labels, float(value.split()[0])))
    return out
