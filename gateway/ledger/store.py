"""Database statements of the ledger: batch inserts of rows and the price table.

Postgres takes a batch by one COPY straight into the ledger: a single round trip, no
explicit transaction (a lone COPY is atomic) and nothing returned, as every row of a
committed COPY is new. Only a
batch that hits the unique request_id (a replay after a commit whose reply was lost, or
a spool replayed twice) is written the careful way: COPY into a per-connection staging
table and ``INSERT ... SELECT ... ON CONFLICT (request_id) DO NOTHING RETURNING``, so a
replayed batch never counts a call twice. SQLite takes a batch by one INSERT ... ON
CONFLICT DO NOTHING on its driver connection, with the same rule for a replay (see
``_insert_sqlite``). Either way the ledger's triggers add exactly the rows inserted to the
hourly rollup in the same statement (gateway.ledger.rollup).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import aiosqlite
import asyncpg
import orjson
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.ledger.db import DB_ERRORS
from gateway.ledger.models import ROW_COLUMNS, LedgerRow, Price, quantize
from gateway.ledger.prices import PriceVersion
from gateway.ledger.rows import Row

_COLS = ", ".join(ROW_COLUMNS)
_SQLITE = SQLiteDialect_aiosqlite()
_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS ledger_stage ON COMMIT DELETE ROWS AS "
    f"SELECT {_COLS} FROM ledger WITH NO DATA"
)
_MERGE = (
    f"INSERT INTO ledger ({_COLS}) SELECT {_COLS} FROM ledger_stage "
    "ON CONFLICT (request_id) DO NOTHING RETURNING request_id"
)
_SQLITE_INSERT = (
    f"INSERT INTO ledger ({_COLS}) VALUES ({', '.join('?' * len(ROW_COLUMNS))}) "
    "ON CONFLICT (request_id) DO NOTHING"
)
_SQLITE_HELD = "SELECT request_id FROM ledger WHERE request_id IN (SELECT value FROM json_each(?))"
_SQLITE_TS: Callable[[datetime], str] = LedgerRow.__table__.c.ts.type.dialect_impl(
    _SQLITE
).bind_processor(_SQLITE)  # type: ignore[assignment]
"""ts as SQLAlchemy writes it on SQLite, so reports compare the text they expect."""


class RowSink:
    """The ledger writer's way into the database: one connection held from batch to batch.

    Checking a connection out of the pool for every batch (its liveness ping, and the
    rollback when it goes back) cost more gateway CPU than COPYing a batch of a few hundred
    rows. A connection whose write failed in any way is dropped; the next batch opens a
    fresh one (so a restarted database is picked up like with the pool's ping). On
    Postgres the connection encodes timestamptz from epoch seconds (Row.ts), so it never
    goes back to the pool.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._conn: AsyncConnection | None = None
        self._pg: asyncpg.Connection | None = None
        self._lite: aiosqlite.Connection | None = None

    async def insert(self, rows: Sequence[Row]) -> list[Row]:
        """Write a batch atomically; returns the rows that were new (as insert_rows)."""
        try:
            if self._conn is None:
                self._conn = await self._engine.connect()
                driver = (await self._conn.get_raw_connection()).driver_connection
                if isinstance(driver, asyncpg.Connection):
                    self._pg = driver
                    await self._pg.set_type_codec(
                        "timestamptz", schema="pg_catalog", encoder=_pg_time,
                        decoder=_from_pg_time, format="binary",
                    )  # fmt: skip
                else:
                    assert isinstance(driver, aiosqlite.Connection)
                    self._lite = driver
            if self._pg is not None:
                return _new_rows(rows, await _copy_rows(self._pg, rows))
            assert self._lite is not None
            return await _insert_sqlite(self._lite, rows)
        except BaseException:
            await self.aclose(broken=True)
            raise

    async def aclose(self, broken: bool = False) -> None:
        conn, pg, self._conn, self._pg, self._lite = self._conn, self._pg, None, None, None
        if conn is None:
            return
        with contextlib.suppress(*DB_ERRORS):
            if broken or pg is not None:
                await conn.invalidate()  # never back into the pool: broken, or its codec
            await conn.close()


async def insert_rows(engine: AsyncEngine, rows: Sequence[Row]) -> list[Row]:
    """Write a batch atomically; returns the rows that were new.

    A row whose request_id the ledger already holds (a replay after a commit whose reply
    was lost) is skipped and left out of the result, so nothing downstream counts it twice.
    """
    sink = RowSink(engine)
    try:
        return await sink.insert(rows)
    finally:
        await sink.aclose()


_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_INT64 = struct.Struct("!q")


def _pg_time(epoch: float) -> bytes:
    """Epoch seconds as Postgres' binary timestamptz: int64 microseconds since 2000."""
    return _INT64.pack(round((epoch - 946_684_800) * 1_000_000))


def _from_pg_time(data: bytes) -> datetime:
    return _PG_EPOCH + timedelta(microseconds=_INT64.unpack(data)[0])


def _new_rows(rows: Sequence[Row], new: set[str] | None) -> list[Row]:
    if new is None or len(new) == len(rows):
        return list(rows)
    return [r for r in rows if r.request_id in new]


async def _copy_rows(pg: asyncpg.Connection, rows: Sequence[Row]) -> set[str] | None:
    """COPY the batch; None when every row was new, else the request ids that were.

    A lone COPY is a transaction of its own (all rows or none), so the common path needs
    no BEGIN and COMMIT round trips. Rows go as plain tuples: asyncpg indexes a tuple
    subclass through Python's __getitem__, which makes the COPY markedly costlier.
    """
    records = list(map(tuple, rows))
    try:
        await pg.copy_records_to_table("ledger", records=records, columns=ROW_COLUMNS)
        return None
    except asyncpg.UniqueViolationError:
        pass  # some rows are in already: merge the batch, skipping those
    async with pg.transaction():
        await pg.execute(_STAGE)
        await pg.copy_records_to_table("ledger_stage", records=records, columns=ROW_COLUMNS)
        return {r[0] for r in await pg.fetch(_MERGE)}


async def _insert_sqlite(db: aiosqlite.Connection, rows: Sequence[Row]) -> list[Row]:
    """One INSERT for the whole batch, then the commit: two trips to the driver's thread,
    which runs the statement, the rollup's row triggers and the commit without the GIL for
    most of it. executemany keeps the statement the same whatever the batch size: sqlite3
    keeps the last 128 statements prepared by their text, and one per size held hundreds
    of MB in a busy gateway.

    ``ON CONFLICT (request_id) DO NOTHING`` skips a row the ledger already holds, and
    the count inserted tells whether every row was new. When one was not (a replay after
    a commit whose reply was lost), the batch is undone and written again in one
    transaction that first reads which of its ids were in already: those rows are left
    out of the result, so nothing downstream counts them twice.
    """
    # A Row's fields are ROW_COLUMNS in order, ts second: only ts needs its column's form.
    params = [(r.request_id, _SQLITE_TS(datetime.fromtimestamp(r.ts, UTC)), *r[2:]) for r in rows]
    inserted = await db.executemany(_SQLITE_INSERT, params)
    if inserted.rowcount == len(rows):
        await db.commit()
        return list(rows)
    await db.rollback()
    await db.execute("BEGIN IMMEDIATE")  # no other writer between the read and the write
    ids = orjson.dumps([r.request_id for r in rows]).decode()
    held = {request_id for (request_id,) in await db.execute_fetchall(_SQLITE_HELD, (ids,))}
    await db.executemany(_SQLITE_INSERT, params)
    await db.commit()
    return [r for r in rows if r.request_id not in held]


async def load_prices(engine: AsyncEngine) -> list[PriceVersion]:
    async with engine.connect() as conn:
        result = await conn.execute(select(Price))
        return [_version(p) for p in result.all()]


async def add_price(
    engine: AsyncEngine,
    model: str,
    effective_from: datetime,
    prices: tuple[Decimal, Decimal, Decimal, Decimal],
    source: str,
    now: datetime,
) -> None:
    """Add a version; adding the same (model, effective_from) twice keeps the first."""
    values = dict(
        zip(("input", "cached_input", "cache_write", "output"), map(quantize, prices), strict=True)
    )
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(Price).on_conflict_do_nothing(index_elements=["model", "effective_from"])
    async with engine.begin() as conn:
        await conn.execute(
            stmt,
            {
                "model": model,
                "effective_from": effective_from,
                "source": source,
                "created_at": now,
                **values,
            },
        )


def _version(p: Any) -> PriceVersion:
    return PriceVersion(
        id=p.id,
        model=p.model,
        effective_from=p.effective_from,
        input=p.input,
        cached_input=p.cached_input,
        cache_write=p.cache_write,
        output=p.output,
        source=p.source,
    )
