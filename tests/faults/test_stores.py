"""Store outages under load: the private Postgres stopped for 30 s."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.faults.cluster import Stores, start_cluster
from tests.faults.conftest import Figures
from tests.faults.load import Load, run_load

POSTGRES_DOWN = 30.0


def test_postgres_stopped_30_s_every_answered_call_has_one_ledger_row(
    stores: Stores, tmp_path: Path, figures: Figures
) -> None:
    with start_cluster(stores, tmp_path) as cluster:

        async def outage(load: Load) -> None:
            await load.calls(30)
            await asyncio.to_thread(stores.pg.stop, "immediate")
            await asyncio.sleep(POSTGRES_DOWN)
            await asyncio.to_thread(stores.pg.start)
            await load.more_calls(60)

        load = asyncio.run(run_load(cluster.url, cluster.key, outage))
        answered = [o.request_id for o in load.outcomes if o.status is not None]
        rows = cluster.rows_by_call(set(answered), deadline=time.monotonic() + 30)
    figures.add("Postgres stopped 30 s", load, answered=len(answered),
                ledger_rows=sum(rows.values()))  # fmt: skip
    assert load.failed == []
    assert None not in answered
    assert len(set(answered)) == len(answered)
    assert {call: n for call, n in rows.items() if n != 1} == {}
