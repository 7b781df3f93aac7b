"""Backend faults under load: one of three backends killed, or frozen."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import datetime
from pathlib import Path

import httpx

from tests.e2e.conftest import MODEL
from tests.faults.cluster import BACKENDS, Stores, start_cluster
from tests.faults.conftest import Figures
from tests.faults.load import Load, run_load


def test_kill_9_one_of_three_backends_fails_no_non_streamed_call(
    stores: Stores, tmp_path: Path, figures: Figures
) -> None:
    with start_cluster(stores, tmp_path) as cluster:
        victim = cluster.sims[0]

        async def kill(load: Load) -> None:
            await load.calls(30)
            victim.proc.send_signal(signal.SIGKILL)
            await load.more_calls(90)

        load = asyncio.run(run_load(cluster.url, cluster.key, kill))
    figures.add("kill -9 one of three backends", load)
    assert victim.proc.poll() == -signal.SIGKILL
    assert [o for o in load.of(stream=False) if not o.ok] == []


FIRST_BYTE_TIMEOUT = 2.0
"""The gateway's first-byte and idle timeouts here: short, so the experiment stays short."""


def test_sigstop_one_of_three_backends_is_ejected_and_no_call_waits_past_a_retry(
    stores: Stores, tmp_path: Path, figures: Figures
) -> None:
    upstream = {"first_byte_timeout": FIRST_BYTE_TIMEOUT, "idle_timeout": FIRST_BYTE_TIMEOUT,
                "health_interval": 0.5, "health_timeout": 0.5}  # fmt: skip
    with start_cluster(stores, tmp_path, upstream=upstream) as cluster:
        victim = cluster.sims[0]
        frozen_at: list[float] = []
        seen_out: list[float] = []

        async def freeze(load: Load) -> None:
            await load.calls(30)
            victim.proc.send_signal(signal.SIGSTOP)
            frozen_at.append(time.time())
            seen_out.append(await until_ejected(cluster.url, time.monotonic() + 10))
            await load.more_calls(90)

        start = time.time()
        load = asyncio.run(run_load(cluster.url, cluster.key, freeze))
        ejected = ejected_at(cluster.gateway.output(), victim.url.removeprefix("http://"))
    out_after = ejected - frozen_at[0]
    normal = max(o.duration for o in load.outcomes if start + o.started + o.duration < frozen_at[0])
    # No call waits past a retry: from the freeze (or its start, if later) it takes at most
    # one timeout on the frozen backend and a normal call's time. From the freeze, not its
    # start: a stream begun before it may have run for a normal call's time already.
    after_freeze = [start + o.started + o.duration - max(start + o.started, frozen_at[0])
                    for o in load.outcomes]  # fmt: skip
    figures.add(
        "SIGSTOP one of three backends",
        load,
        ejected_after=f"{out_after:.2f} s",
        seen_out_by_ready_after=f"{seen_out[0]:.2f} s",
        normal_max=f"{normal:.2f} s",
        longest_after_freeze=f"{max(after_freeze):.2f} s",
    )
    assert out_after <= 2.0
    assert max(after_freeze) <= FIRST_BYTE_TIMEOUT + normal
    assert [o for o in load.of(stream=False) if not o.ok] == []


def ejected_at(log: str, backend: str) -> float:
    """When the gateway ejected the backend (epoch seconds), from its log line saying so."""
    for line in log.splitlines():
        if f"backend {backend} ejected" in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    raise AssertionError(f"the gateway never logged ejecting {backend}")


async def until_ejected(url: str, deadline: float) -> float:
    """Seconds until /ready counts one backend of the model out: the gateway's decision
    plus the time a busy gateway takes to answer /ready."""
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        while time.monotonic() < deadline:
            ready = (await client.get("/ready")).json()
            if ready["backends"][MODEL]["healthy"] < BACKENDS:
                return time.monotonic() - began
            await asyncio.sleep(0.05)
    raise AssertionError("the frozen backend was never taken out")
