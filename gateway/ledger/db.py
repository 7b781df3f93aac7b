"""Engines for the ledger database: asyncpg for Postgres, aiosqlite for the embedded file."""

from __future__ import annotations

from typing import Any

import asyncpg
from sqlalchemy import event, make_url, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    SQLAlchemyError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
)
"""What a failing or unreachable database raises, through SQLAlchemy or raw asyncpg."""


class LedgerUnavailable(Exception):
    """The ledger database cannot be used at start: reported to the operator, who must act."""


ASYNC_DRIVERS = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
}


def async_url(url: str) -> str:
    """Map the configured plain URL (postgresql://, sqlite:///) to its async driver."""
    scheme, sep, rest = url.partition("://")
    return f"{ASYNC_DRIVERS.get(scheme, scheme)}{sep}{rest}"


def make_engine(url: str, timeout: float = 5.0) -> AsyncEngine:
    """An engine whose connects and statements give up after ``timeout`` seconds.

    The timeout bounds how long the ledger writer waits on a sick database before it
    spools instead; pre-ping drops connections a restarted Postgres left dead.
    """
    full = async_url(url)
    args: dict[str, Any] = {}
    if full.startswith("postgresql+asyncpg"):
        args = {"timeout": timeout, "command_timeout": timeout}
    elif full.startswith("sqlite"):
        args = {"timeout": timeout}
    engine = create_async_engine(full, pool_pre_ping=True, connect_args=args)
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_wal)
    return engine


def _sqlite_wal(dbapi_conn: Any, _record: Any) -> None:
    """WAL lets reports read the file while the writer appends."""
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()


def safe_url(url: str) -> str:
    """The URL with any password masked, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


async def ping(engine: AsyncEngine) -> bool:
    """True when the database answers a trivial query."""
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except DB_ERRORS:
        return False
    return True
