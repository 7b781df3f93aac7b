"""Postgres goes away while calls keep coming: every call still ends up exactly once.

These tests stop and start a private Postgres server of their own, never the shared one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import asyncpg
from prometheus_client import CollectorRegistry

from gateway.flow import Call, Usage
from gateway.ledger import Ledger
from gateway.ledger.db import make_engine
from gateway.ledger.migrate import upgrade
from gateway.ledger.models import to_units
from gateway.ledger.rows import Row
from tests.integration.ledger.factory import ledger_settings, make_call, record
from tests.integration.ledger.postgres import PrivatePostgres

PRICES = {"alpha": {"input": "0.15", "cached_input": "0.075", "output": "0.60"}}
CALL_COST = "0.00018"  # 1000 - 400 input at 0.15, 400 cached at 0.075, 100 output at 0.60


async def migrate(url: str) -> None:
    engine = make_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


async def ledger_counts(url: str) -> tuple[int, int, str]:
    conn = await asyncpg.connect(url, timeout=5)
    try:
        row = await conn.fetchrow(
            "SELECT count(*), count(DISTINCT request_id), sum(cost_total)::text FROM ledger"
        )
    finally:
        await conn.close()
    assert row is not None
    return row[0], row[1], row[2]


async def record_for(ledger: Ledger, seconds: float, out: list[Call]) -> None:
    """Record a call every millisecond or so, as a busy gateway would."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(5):
            call = make_call("alpha", usage=Usage(1000, 400, 100))
            record(ledger, call)
            out.append(call)
        await asyncio.sleep(0.005)


def gauge(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None
    return value


async def test_outage_loses_and_doubles_nothing(
    private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    await migrate(private_pg.url)
    registry = CollectorRegistry()
    settings = ledger_settings(private_pg.url, tmp_path / "spool", PRICES, batch_size=200)
    ledger = Ledger(settings, registry)
    await ledger.start()
    calls: list[Call] = []

    await record_for(ledger, 0.5, calls)
    # A crash-like stop (no checkpoint, connections cut mid-batch), with calls still flowing.
    stopping = asyncio.create_task(asyncio.to_thread(private_pg.stop, "immediate"))
    await record_for(ledger, 1.5, calls)
    await stopping
    await record_for(ledger, 0.5, calls)
    spooled_during_outage = gauge(registry, "gateway_ledger_spool_rows")
    ready_during_outage = await ledger.ready()
    starting = asyncio.create_task(asyncio.to_thread(private_pg.start))
    await record_for(ledger, 1.0, calls)
    await starting
    assert await ledger.ready()
    await record_for(ledger, 0.5, calls)
    for _ in range(300):  # the replay drains the spool within seconds
        if not gauge(registry, "gateway_ledger_spool_rows"):
            break
        await asyncio.sleep(0.1)
    await ledger.aclose()

    assert spooled_during_outage > 0
    assert not ready_during_outage
    assert gauge(registry, "gateway_ledger_write_failures_total") > 0
    assert gauge(registry, "gateway_ledger_spool_rows") == 0
    assert gauge(registry, "gateway_ledger_queue_depth") == 0
    n = len(calls)
    assert await ledger_counts(private_pg.url) == (n, n, str(n * to_units(Decimal(CALL_COST))))
    assert gauge(registry, "gateway_ledger_rows_written_total") == n  # replays not counted twice


async def test_rows_spooled_at_shutdown_are_replayed_at_next_start(
    private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    await migrate(private_pg.url)
    settings = ledger_settings(private_pg.url, tmp_path / "spool", PRICES)
    ledger = Ledger(settings, CollectorRegistry())
    await ledger.start()
    calls: list[Call] = []
    await record_for(ledger, 0.2, calls)
    await asyncio.to_thread(private_pg.stop, "fast")
    await record_for(ledger, 0.3, calls)
    await ledger.aclose()  # the database is down: what is queued goes to the spool
    assert list((tmp_path / "spool").glob("*.spool"))

    spooled = sum(f.stat().st_size for f in (tmp_path / "spool").glob("*.spool"))
    assert spooled > 0

    await asyncio.to_thread(private_pg.start)
    # The replay starts with the ledger; how far it got by now is a race, so only the
    # end state is asserted: every row once, and the spool gone.
    restarted = Ledger(settings, CollectorRegistry())
    await restarted.start()
    await restarted.aclose()

    n = len(calls)
    assert await ledger_counts(private_pg.url) == (n, n, str(n * to_units(Decimal(CALL_COST))))
    assert not list((tmp_path / "spool").glob("*.spool"))


async def test_a_surprise_in_the_write_spools_the_batch_instead_of_losing_it(
    pg_db_url: str, tmp_path: Path
) -> None:
    """An error no database raises (a bug, or rows an older gateway builds for a newer
    schema) must not drop the batch it happened to: it waits in the spool for a writer
    that can write it, and reaches the ledger exactly once."""
    settings = ledger_settings(pg_db_url, tmp_path / "spool", PRICES)
    ledger = Ledger(settings, CollectorRegistry())
    await ledger.start()
    writer = ledger._writer
    assert writer is not None
    sink = writer._sink
    real_insert = sink.insert

    async def broken(rows: Sequence[Row]) -> list[Row]:
        raise TypeError("an encoder that does not know this column")

    sink.insert = broken  # type: ignore[method-assign]
    calls: list[Call] = []
    await record_for(ledger, 0.2, calls)
    for _ in range(100):
        if writer._spool.rows == len(calls):
            break
        await asyncio.sleep(0.05)
    assert writer._spool.rows == len(calls) > 0
    sink.insert = real_insert  # type: ignore[method-assign]
    await ledger.aclose()  # a clean stop replays nothing new; the next start does
    restarted = Ledger(settings, CollectorRegistry())
    await restarted.start()
    await restarted.aclose()
    n = len(calls)
    assert await ledger_counts(pg_db_url) == (n, n, str(n * to_units(Decimal(CALL_COST))))
