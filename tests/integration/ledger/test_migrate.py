"""The same migrations build the same schema on Postgres and SQLite, from the CLI too."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger import Ledger
from gateway.ledger.db import LedgerUnavailable, make_engine
from gateway.ledger.migrate import (
    SchemaError,
    alembic_config,
    current_revision,
    head_revision,
    upgrade,
)
from gateway.ledger.models import to_units
from gateway.settings import load_settings
from gateway.tables import metadata
from tests.servers import ROOT, free_port


def schema_diff(conn: Connection) -> list[object]:
    return list(compare_metadata(MigrationContext.configure(conn), metadata))


async def test_migrations_match_the_models(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert await upgrade(engine) == head_revision()
        assert await upgrade(engine) == head_revision()  # a second run is a no-op
        async with engine.connect() as conn:
            assert await conn.run_sync(schema_diff) == []
    finally:
        await engine.dispose()


def test_gateway_migrate_command(pg_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "migrate", "--database-url", pg_url],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ledger schema at revision {head_revision()}"


async def test_start_refuses_an_unmigrated_postgres(pg_db_url: str, tmp_path: Path) -> None:
    settings = load_settings(database={"url": pg_db_url}, ledger={"spool_dir": str(tmp_path)})
    ledger = Ledger(settings, CollectorRegistry())
    with pytest.raises(SchemaError, match="run `gateway migrate`"):
        await ledger.start()
    await ledger.aclose()


async def test_start_names_an_unreachable_database() -> None:
    url = f"postgresql://gw:secret@127.0.0.1:{free_port()}/ledger"
    settings = load_settings(database={"url": url, "timeout": 1.0})
    ledger = Ledger(settings, CollectorRegistry())
    with pytest.raises(LedgerUnavailable, match=r"ledger database postgresql://gw:\*\*\*@"):
        await ledger.start()
    await ledger.aclose()


async def test_sqlite_default_migrates_itself_at_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/gateway.db"
    settings = load_settings(database={"url": url}, ledger={"spool_dir": str(tmp_path)})
    ledger = Ledger(settings, CollectorRegistry())
    await ledger.start()
    assert await ledger.ready()
    await ledger.aclose()
    engine = make_engine(url)
    try:
        assert await current_revision(engine) == head_revision()
    finally:
        await engine.dispose()


async def test_workers_starting_together_migrate_once(db_url: str) -> None:
    engines = [make_engine(db_url) for _ in range(4)]
    try:
        revisions = await asyncio.gather(*(upgrade(e) for e in engines))
    finally:
        for engine in engines:
            await engine.dispose()
    assert revisions == [head_revision()] * 4


async def migrate_to(engine: AsyncEngine, revision: str, down: bool = False) -> None:
    """Migrate to a revision, then drop the pooled connections (their cached statements
    would describe the old column types)."""
    cfg = alembic_config()

    def run(conn: Connection) -> None:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)

    async with engine.begin() as conn:
        await conn.run_sync(run)
    await engine.dispose()


OLD_COSTS = ("0.0000000001", "12345678.9999999999", "0E-10", "0.0001200000", "99999.5",
             "0.0003932641")  # fmt: skip
"""Amounts a 0003 ledger holds: the smallest, the largest digits, zero, and typical ones."""


async def test_0004_turns_usd_costs_into_exact_units_and_back(db_url: str) -> None:
    """On Postgres the NUMERIC USD columns become BIGINT units; SQLite held units already."""
    engine = make_engine(db_url)
    pg = engine.dialect.name == "postgresql"
    stored = [Decimal(c) if pg else to_units(Decimal(c)) for c in OLD_COSTS]
    insert = text(
        "INSERT INTO ledger (request_id, ts, endpoint, stream, status, served_by, disconnected,"
        " estimated, prompt_tokens, input_tokens, cached_tokens, cache_write_tokens,"
        " completion_tokens, predicted_cached_tokens, cost_input, cost_cached_input,"
        " cost_cache_write, cost_output, cost_total, cost_without_cache) VALUES ('old',"
        " '2026-11-01 00:00:00', 'chat', false, 200, 'upstream', false, false, 0, 0, 0, 0, 0,"
        " 0, :c0, :c1, :c2, :c3, :c4, :c5)"
    )
    costs = text(
        "SELECT cost_input, cost_cached_input, cost_cache_write, cost_output, cost_total,"
        " cost_without_cache FROM ledger"
    )
    try:
        await migrate_to(engine, "0003")
        async with engine.begin() as conn:
            await conn.execute(insert, {f"c{i}": v for i, v in enumerate(stored)})
        await migrate_to(engine, "head")
        async with engine.connect() as conn:
            units = tuple((await conn.execute(costs)).one())
        assert units == tuple(to_units(Decimal(c)) for c in OLD_COSTS)
        assert all(type(u) is int for u in units)
        await migrate_to(engine, "0003", down=True)
        async with engine.connect() as conn:
            assert tuple((await conn.execute(costs)).one()) == tuple(stored)
    finally:
        await engine.dispose()
