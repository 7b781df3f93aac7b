"""A row the database refuses for its content is set aside; every other row flows.

The poisoned rows are made at the writer's seam (parse refuses such input from clients):
a NUL in the model, which Postgres refuses in any text, and a cost beyond BIGINT, which
both databases' drivers refuse to encode.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.flow import Call, Cost, Usage
from gateway.ledger import Ledger, deadletters
from gateway.ledger.db import make_engine, refused_content
from gateway.ledger.models import LedgerRow
from gateway.ledger.rows import Row, ledger_row
from gateway.ledger.spool import Spool
from gateway.settings import Settings
from tests.integration.ledger.factory import ledger_settings, make_call, record
from tests.integration.ledger.postgres import PrivatePostgres
from tests.integration.ledger.test_outage import migrate
from tests.polling import eventually
from tests.servers import ROOT

PRICES = {"alpha": {"input": "0.15", "cached_input": "0.075", "output": "0.60"}}
GOOD = 1000


def good_calls(n: int = GOOD) -> list[Call]:
    return [make_call("alpha", usage=Usage(1000, 400, 100)) for _ in range(n)]


def poisoned(url: str) -> Row:
    """A row the database refuses: a NUL in the model on Postgres, where that is what a
    client could once send; a cost no BIGINT holds on SQLite, which takes any text."""
    if url.startswith("postgresql"):
        return ledger_row(make_call("al\x00pha"), Cost())
    return ledger_row(make_call("alpha"), Cost(total=2**63))


def metric(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None, name
    return value


async def ledger_ids(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        result = await conn.execute(select(LedgerRow.request_id).order_by(LedgerRow.id))
        return list(result.scalars())


def settings_for(url: str, spool: Path) -> Settings:
    return ledger_settings(url, spool, PRICES, batch_size=200)


async def poison_then_good(ledger: Ledger, url: str) -> tuple[Row, list[Call]]:
    """One poisoned row, then GOOD good calls, recorded as a busy gateway would."""
    bad = poisoned(url)
    assert ledger._writer is not None
    ledger._writer.put(bad)
    calls = good_calls()
    for i, call in enumerate(calls):
        record(ledger, call)
        if i % 50 == 0:
            await asyncio.sleep(0)
    return bad, calls


async def test_a_poisoned_row_is_set_aside_and_every_other_row_written(
    db_url: str, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    ledger = Ledger(settings_for(db_url, tmp_path / "spool"), registry)
    await ledger.start()
    bad, calls = await poison_then_good(ledger, db_url)
    await eventually(
        lambda: registry.get_sample_value("gateway_ledger_rows_written_total") == GOOD, within=30
    )
    await ledger.aclose()

    engine = make_engine(db_url)
    try:
        assert await ledger_ids(engine) == [c.id for c in calls]  # all, once, in order
        letters = await deadletters.listing(engine)
    finally:
        await engine.dispose()
    assert [letter.request_id for letter in letters] == [bad.request_id]
    assert letters[0].to_json()["row"]["model"] == bad.model  # exact, NUL and all
    assert metric(registry, "gateway_ledger_dead_letters_total") == 1
    assert metric(registry, "gateway_ledger_dead_letter_rows") == 1
    assert metric(registry, "gateway_ledger_write_failures_total") == 0  # no outage
    assert metric(registry, "gateway_ledger_spool_rows") == 0


async def test_spool_replay_at_start_sets_a_poisoned_row_aside(db_url: str, tmp_path: Path) -> None:
    """A spool left by an earlier run (poison first) replays past the poison."""
    spool = Spool(tmp_path / "spool")
    spool.open()
    bad, calls = poisoned(db_url), good_calls()
    spool.append([bad])
    spool.append([ledger_row(c, Cost()) for c in calls])
    spool.close()

    registry = CollectorRegistry()
    ledger = Ledger(settings_for(db_url, tmp_path / "spool"), registry)
    await ledger.start()
    await eventually(lambda: registry.get_sample_value("gateway_ledger_spool_rows") == 0, within=30)
    await ledger.aclose()

    engine = make_engine(db_url)
    try:
        assert await ledger_ids(engine) == [c.id for c in calls]
        assert [x.request_id for x in await deadletters.listing(engine)] == [bad.request_id]
    finally:
        await engine.dispose()
    assert metric(registry, "gateway_ledger_dead_letters_total") == 1
    assert not list((tmp_path / "spool").glob("*.spool"))


async def test_poison_and_a_thousand_calls_before_and_after_a_restart(
    private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    """Live: the poisoned row is set aside, the 1,000 calls after it written. Then through
    an outage and a restart: the rows wait in the spool, the ledger is closed with them
    there, and the next one (same spool) replays them past the poison, in order."""
    await migrate(private_pg.url)
    settings = settings_for(private_pg.url, tmp_path / "spool")
    registry = CollectorRegistry()
    ledger = Ledger(settings, registry)
    await ledger.start()
    first_bad, first = await poison_then_good(ledger, private_pg.url)
    await eventually(
        lambda: registry.get_sample_value("gateway_ledger_rows_written_total") == GOOD, within=30
    )
    assert metric(registry, "gateway_ledger_dead_letters_total") == 1
    assert metric(registry, "gateway_ledger_dead_letter_rows") == 1

    await asyncio.to_thread(private_pg.stop, "fast")
    second_bad, second = await poison_then_good(ledger, private_pg.url)
    await ledger.aclose()  # the database is away: everything waits in the spool
    assert metric(registry, "gateway_ledger_spool_rows") == GOOD + 1
    assert metric(registry, "gateway_ledger_dead_letters_total") == 1  # an outage is no poison

    await asyncio.to_thread(private_pg.start)
    after = CollectorRegistry()
    restarted = Ledger(settings, after)
    await restarted.start()
    await eventually(lambda: after.get_sample_value("gateway_ledger_spool_rows") == 0, within=30)
    await restarted.aclose()

    assert metric(after, "gateway_ledger_dead_letters_total") == 1
    assert metric(after, "gateway_ledger_dead_letter_rows") == 2
    assert metric(after, "gateway_ledger_rows_written_total") == GOOD
    engine = make_engine(private_pg.url)
    try:
        assert await ledger_ids(engine) == [c.id for c in first + second]
        letters = await deadletters.listing(engine)
    finally:
        await engine.dispose()
    assert [x.request_id for x in letters] == [first_bad.request_id, second_bad.request_id]
    assert all(x.error.startswith("22021: ") for x in letters)  # invalid byte sequence


def gateway_ledger(url: str, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "ledger", *args, "--database-url", url],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    assert not done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


async def test_dead_letters_are_listed_and_replayed_from_the_cli(
    db_url: str, tmp_path: Path
) -> None:
    ledger = Ledger(settings_for(db_url, tmp_path / "spool"), CollectorRegistry())
    await ledger.start()
    assert ledger._writer is not None
    bad = poisoned(db_url)
    ledger._writer.put(bad)
    await ledger.aclose()

    status, listed = await asyncio.to_thread(gateway_ledger, db_url, "dead-letters")
    [entry] = listed["data"]
    assert entry["request_id"] == bad.request_id
    assert entry["row"]["model"] == bad.model

    status, as_is = await asyncio.to_thread(gateway_ledger, db_url, "replay")
    assert status == 1  # refused again: it stays
    assert as_is["written"] == []
    assert [x["id"] for x in as_is["refused"]] == [entry["id"]]

    status, cleaned = await asyncio.to_thread(gateway_ledger, db_url, "replay", "--clean")
    assert (status, cleaned) == (0, {"written": [entry["id"]], "refused": []})
    engine = make_engine(db_url)
    try:
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT model, cost_total FROM ledger"))).one()
        assert await deadletters.count(engine) == 0
    finally:
        await engine.dispose()
    assert tuple(row) == (("alpha", 0) if db_url.startswith("postgresql") else ("alpha", 2**63 - 1))


@pytest.mark.parametrize("sql", ["SELECT 1/0", "SELECT 'x'::int"])
async def test_refusals_for_content_are_told_from_outages(pg_db_url: str, sql: str) -> None:
    """The classification, on errors a real server raises (data exceptions here; the
    outage side is covered where the server is stopped)."""
    conn = await asyncpg.connect(pg_db_url)
    try:
        with pytest.raises(asyncpg.PostgresError) as info:
            await conn.execute(sql)
    finally:
        await conn.close()
    assert refused_content(info.value)
