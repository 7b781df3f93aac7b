"""The same migrations build the same schema on Postgres and SQLite, from the CLI too."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Connection

from gateway.ledger import Ledger
from gateway.ledger.db import LedgerUnavailable, make_engine
from gateway.ledger.migrate import SchemaError, current_revision, head_revision, upgrade
from gateway.ledger.models import Base
from gateway.settings import load_settings
from tests.servers import ROOT, free_port


def schema_diff(conn: Connection) -> list[object]:
    return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))


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
