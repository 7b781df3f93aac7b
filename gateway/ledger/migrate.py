"""`gateway migrate`: apply the Alembic migrations under migrations/ to the ledger database.

The same migrations serve Postgres and the embedded SQLite file. The gateway applies them
by itself at start on SQLite (or when database.auto_migrate is on); on Postgres an
operator runs this command, and a gateway finding an outdated schema refuses to start.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.db import make_engine
from gateway.settings import SettingsError, load_settings

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


class SchemaError(Exception):
    """The database schema is missing or older than this gateway's migrations."""


def alembic_config() -> Config:
    if not (MIGRATIONS / "env.py").is_file():
        raise SchemaError(f"migrations not found at {MIGRATIONS} (install from the source tree)")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


async def upgrade(engine: AsyncEngine) -> str | None:
    """Bring the schema to head; returns the revision it ends at."""
    cfg = alembic_config()

    def run(conn: Connection) -> None:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")

    async with engine.begin() as conn:
        await conn.run_sync(run)
    return await current_revision(engine)


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
    parser.add_argument("--config", help="YAML settings file")
    parser.add_argument("--database-url", help="default: the settings' database.url")


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config)
    except SettingsError as exc:
        print(exc, file=sys.stderr)  # noqa: T201
        return 2
    url = args.database_url or settings.database.url

    async def main() -> str | None:
        engine = make_engine(url, settings.database.timeout)
        try:
            return await upgrade(engine)
        finally:
            await engine.dispose()

    revision = asyncio.run(main())
    print(f"ledger schema at revision {revision}")  # noqa: T201
    return 0
