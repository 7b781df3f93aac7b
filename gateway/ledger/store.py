"""Database statements of the ledger: batch inserts of rows and the price table.

Postgres takes a batch by COPY into a per-connection staging table and one
``INSERT ... SELECT ... ON CONFLICT (request_id) DO NOTHING``: one round trip for the
data, and a replayed batch can never count a call twice. SQLite gets the same
conflict rule through a multi-row insert.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.ledger.models import ROW_COLUMNS, LedgerRow, Price, quantize
from gateway.ledger.prices import PriceVersion
from gateway.ledger.rows import Row

_RECORD = operator.itemgetter(*ROW_COLUMNS)
"""A row dict as the tuple COPY takes, in ROW_COLUMNS order."""
_COLS = ", ".join(ROW_COLUMNS)
_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS ledger_stage ON COMMIT DELETE ROWS AS "
    f"SELECT {_COLS} FROM ledger WITH NO DATA"
)
_MERGE = (
    f"INSERT INTO ledger ({_COLS}) SELECT {_COLS} FROM ledger_stage "
    "ON CONFLICT (request_id) DO NOTHING RETURNING request_id"
)


async def insert_rows(engine: AsyncEngine, rows: Sequence[Row]) -> list[Row]:
    """Write a batch in one transaction; returns the rows that were new.

    A row whose request_id the ledger already holds (a replay after a commit whose reply
    was lost) is skipped and left out of the result, so nothing downstream counts it twice.
    """
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            new = await _copy_rows(conn, rows)
        else:
            stmt = sqlite.insert(LedgerRow).on_conflict_do_nothing(index_elements=["request_id"])
            result = await conn.execute(stmt.returning(LedgerRow.request_id), list(rows))
            new = set(result.scalars().all())
            await conn.commit()
    return list(rows) if len(new) == len(rows) else [r for r in rows if r["request_id"] in new]


async def _copy_rows(conn: AsyncConnection, rows: Sequence[Row]) -> set[str]:
    raw = await conn.get_raw_connection()
    pg = raw.driver_connection
    assert pg is not None
    records = list(map(_RECORD, rows))
    async with pg.transaction():
        await pg.execute(_STAGE)
        await pg.copy_records_to_table("ledger_stage", records=records, columns=ROW_COLUMNS)
        return {r[0] for r in await pg.fetch(_MERGE)}


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
