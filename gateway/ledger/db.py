"""Engines for the ledger database: asyncpg for Postgres, aiosqlite for the embedded file."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import sqlalchemy.exc
from sqlalchemy import event, make_url, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    SQLAlchemyError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    sqlite3.Error,
)
"""What a failing or unreachable database raises, through SQLAlchemy or the raw drivers
(asyncpg, sqlite3 through aiosqlite) the ledger writer uses."""

CONTENT_SQLSTATES = ("22", "23")
"""SQLSTATE classes of a refused value: data exception (a NUL or a character the encoding
lacks, a string too long, a number out of range) and integrity constraint violation (not
null, check, foreign key)."""


def refused_content(exc: BaseException) -> bool:
    """True when the database (or its driver) refused rows for what they hold, not because
    it is away, busy or shutting down.

    Only such a refusal sets a row aside as a dead letter: an outage (connection refused or
    reset, a timeout, too many connections, a server shutting down) and any error nobody
    expected keep the rows in the spool until a write succeeds.
    """
    if isinstance(exc, OverflowError | UnicodeError):  # the driver could not encode a value
        return True
    if isinstance(exc, sqlalchemy.exc.DataError | sqlalchemy.exc.IntegrityError):
        return True
    if isinstance(exc, sqlite3.DataError | sqlite3.IntegrityError):  # the writer's raw driver
        return True
    seen: BaseException | None = exc
    for _ in range(4):  # SQLAlchemy wraps the driver's error, which names the SQLSTATE
        if seen is None:
            break
        state = getattr(seen, "sqlstate", None)
        if isinstance(state, str) and state[:2] in CONTENT_SQLSTATES:
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__
    return False


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


T = TypeVar("T")


def run_on_database(url: str, timeout: float, work: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Run ``work`` on a fresh engine in an event loop of its own, then dispose of the
    engine: how the command-line tools reach the ledger database."""

    async def main() -> T:
        engine = make_engine(url, timeout)
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


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
