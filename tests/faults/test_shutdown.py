"""SIGTERM under load: the gateway drains what it accepted, meters it, and exits 0."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from tests.faults.cluster import Stores, start_cluster
from tests.faults.conftest import Figures
from tests.faults.load import Load, run_load


def test_sigterm_completes_and_meters_every_accepted_call_and_exits_0(
    stores: Stores, tmp_path: Path, figures: Figures
) -> None:
    with start_cluster(stores, tmp_path) as cluster:
        gateway = cluster.gateway.proc
        exit_code: list[int] = []

        async def terminate(load: Load) -> None:
            await load.calls(60)
            gateway.send_signal(signal.SIGTERM)
            exit_code.append(await asyncio.to_thread(gateway.wait, 60))

        load = asyncio.run(run_load(cluster.url, cluster.key, terminate))
        accepted = [o for o in load.outcomes if o.status is not None]
        rows = cluster.rows_by_call({o.request_id for o in accepted}, time.monotonic() + 10)
    figures.add("SIGTERM", load, accepted=len(accepted), ledger_rows=sum(rows.values()),
                exit_code=exit_code[0])  # fmt: skip
    assert exit_code == [0]
    assert [o for o in accepted if not o.ok] == []
    assert len(accepted) >= 30
    assert {call: n for call, n in rows.items() if n != 1} == {}
