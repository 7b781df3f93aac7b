"""`gateway migrate`: apply the Alembic migrations under migrations/ to the ledger database.

The same migrations serve Postgres and the embedded SQLite file. The gateway applies them
by itself at start on SQLite (or when database.auto_migrate is on); on Postgres an
operator runs this command, and a gateway finding an outdated schema refuses to start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.cli import database_arguments, database_target
from gateway.ledger.db import LedgerUnavailable, run_on_database

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


class SchemaError(LedgerUnavailable):
    """The database schema is missing or older than this gateway's migrations."""


def alembic_config() -> Config:
    if not (MIGRATIONS / "env.py").is_file():
        raise SchemaError(f"migrations not found at {MIGRATIONS} (install from the source tree)")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


MIGRATION_LOCK = 0x6777_6C65_6467_6572
"""Postgres advisory lock key ("gwledger") held while migrating."""


async def upgrade(engine: AsyncEngine) -> str | None:
    """Bring the schema to head; returns the revision it ends at.

    Several worker processes may start (and auto-migrate) at once: they take turns, on
    Postgres under an advisory lock, on SQLite under a lock file beside the database,
    and whoever comes second finds the schema at head already.
    """
    cfg = alembic_config()

    def run(conn: Connection) -> None:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")

    async with _file_lock(engine), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(text(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
        await conn.run_sync(run)
    return await current_revision(engine)


@contextlib.asynccontextmanager
async def _file_lock(engine: AsyncEngine) -> AsyncIterator[None]:
    """An exclusive flock on <sqlite file>.migrate-lock; nothing for other databases."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        yield
        return
    fd = os.open(f"{database}.migrate-lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def ensure_schema(engine: AsyncEngine, auto: bool) -> None:
    """Migrate (auto) or check that the schema is at head, failing with what to do."""
    if auto:
        await upgrade(engine)
        return
    current, head = await current_revision(engine), head_revision()
    if current != head:
        raise SchemaError(
            f"ledger schema is at {current or 'nothing'}, this gateway needs {head}: "
            "run `gateway migrate` (or set database.auto_migrate: true)"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    database_arguments(parser)


def run(args: argparse.Namespace) -> int:
    target = database_target(args)
    if target is None:
        return 2
    settings, url = target
    revision = run_on_database(url, settings.database.timeout, upgrade)
    print(f"ledger schema at revision {revision}")  # noqa: T201
    return 0
