"""Backend faults under load: one of three backends killed, or frozen."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests.faults.cluster import Stores, start_cluster
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
