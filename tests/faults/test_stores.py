"""Store outages under load: the private Postgres stopped for 30 s, a Redis for 20 s."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.e2e.keys.conftest import issue_key
from tests.faults.cluster import Stores, start_cluster
from tests.faults.conftest import Figures
from tests.faults.load import Load, run_load
from tests.integration.index.redis_servers import RedisProcess

POSTGRES_DOWN = 30.0
REDIS_DOWN = 20.0
RPM = 60


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


def test_redis_stopped_20_s_every_call_served_and_a_limited_key_within_its_limit(
    stores: Stores, tmp_path: Path, figures: Figures
) -> None:
    """limits.on_outage: local (the default). A Redis with persistence, stopped and started
    again as an operator would: calls of an unlimited key are all served, and a key at
    60 a minute hammered by 8 clients through the outage is served no more than its
    bucket allows over the whole run (60 + a call a second), the outage included."""
    redis = RedisProcess("--dir", str(tmp_path), "--dbfilename", "limits.rdb")
    redis.start()
    try:
        with start_cluster(Stores(stores.pg, redis), tmp_path) as cluster:
            _, limited = issue_key(cluster.url, "faults", rpm=RPM)
            load, hammered = asyncio.run(redis_outage(cluster.url, cluster.key, limited, redis))
            # A probe (every redis.probe_interval, 1 s) finds Redis again; the calls after
            # the restart can all finish before the first probe that succeeds.
            deadline = time.monotonic() + 10
            while (degraded := cluster.metric("gateway_limits_degraded", mode="local")) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.2)
    finally:
        redis.kill()
    served = [o for o in hammered.outcomes if o.ok]
    window = max(o.started + o.duration for o in served) - min(o.started for o in served)
    allowed = RPM + int(window * RPM / 60)
    refused = [o for o in hammered.outcomes if o.status == 429]
    figures.add("Redis stopped 20 s", load, limited_key_served=f"{len(served)}/{allowed}",
                refused_429=len(refused))  # fmt: skip
    assert load.failed == []
    assert len(served) <= allowed
    assert len(served) + len(refused) == len(hammered.outcomes)  # 200 or 429, nothing else
    assert degraded == 0  # shared again within ten probes


async def redis_outage(url: str, key: str, limited: str, redis: RedisProcess) -> tuple[Load, Load]:
    """The fault under the main load, and 8 clients on the limited key until it ends."""
    over = asyncio.Event()

    async def outage(load: Load) -> None:
        await load.calls(30)
        await asyncio.to_thread(redis.stop)
        await asyncio.sleep(REDIS_DOWN)
        await asyncio.to_thread(redis.start)
        await load.more_calls(60)
        over.set()

    async def until_over(load: Load) -> None:
        await over.wait()

    return await asyncio.gather(
        run_load(url, key, outage), run_load(url, limited, until_over, clients=8)
    )
