"""Dead letters: ledger rows the database refused for what they hold, set aside.

The writer cuts a refused batch down to the rows at fault and puts each here, in the
``ledger_dead_letters`` table of the ledger database, while every other row flows on. A row
is kept as JSON text with every non-ASCII and control character escaped, so the table can
hold what the ledger could not (Postgres refuses a NUL even in text and jsonb), together
with why it was refused. An operator lists them and replays them (``gateway ledger``),
as they are or cleaned: control characters removed, strings cut and numbers clamped to
their columns.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Integer, SmallInteger, String, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.db import refused_content
from gateway.ledger.models import DeadLetter, LedgerRow
from gateway.ledger.rows import Row
from gateway.ledger.spool import row_from

MAX_ERROR_CHARS = 2000
_UNSTORABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
"""Control characters and lone surrogates: what cleaning removes from a string."""


@dataclass(frozen=True, slots=True)
class Letter:
    id: int
    request_id: str
    set_aside_at: datetime
    error: str
    row: str
    """The row as ASCII JSON, as the spool writes it (the decoded values are exact)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "request_id": self.request_id,
            "set_aside_at": self.set_aside_at.isoformat(),
            "error": self.error,
            "row": json.loads(self.row),
        }


def letter(row: Row, exc: BaseException, now: datetime) -> dict[str, Any]:
    """The dead-letter record of a refused row: only ASCII, whatever the row holds."""
    text = json.dumps(row.values(), default=datetime.isoformat)
    return {
        "digest": hashlib.sha256(text.encode()).hexdigest(),
        "request_id": _escaped(row.request_id)[:64],
        "set_aside_at": now,
        "error": _reason(exc),
        "row": text,
    }


def _reason(exc: BaseException) -> str:
    """SQLSTATE (or the driver's error class) and message, escaped and bounded."""
    state = getattr(exc, "sqlstate", None) or type(exc).__name__
    return _escaped(f"{state}: {exc}")[:MAX_ERROR_CHARS]


def _escaped(text: str) -> str:
    """JSON's escapes for control and non-ASCII characters, without the quotes."""
    return json.dumps(text)[1:-1]


async def set_aside(engine: AsyncEngine, letters: Sequence[dict[str, Any]]) -> None:
    """Store the letters; one already there (the same row set aside again, by a replay
    repeated after a crash) is kept once."""
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(DeadLetter).on_conflict_do_nothing(index_elements=["digest"])
    async with engine.begin() as conn:
        await conn.execute(stmt, list(letters))


async def count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(DeadLetter))).scalar_one())


async def listing(engine: AsyncEngine, limit: int = 100) -> list[Letter]:
    """The oldest letters first."""
    stmt = select(DeadLetter).order_by(DeadLetter.id).limit(limit)
    async with engine.connect() as conn:
        result = await conn.execute(stmt)
        return [Letter(r.id, r.request_id, r.set_aside_at, r.error, r.row) for r in result.all()]


@dataclass(slots=True)
class Replayed:
    written: list[int]
    """Letters whose row is in the ledger now (or already was): removed from the table."""
    refused: list[dict[str, Any]]
    """Letters the database refused again (id, error): they stay."""


async def replay(
    engine: AsyncEngine, ids: Sequence[int] | None = None, clean: bool = False
) -> Replayed:
    """Write the letters' rows to the ledger, each with its letter's removal in one
    transaction. Every letter when ``ids`` is None; ``clean`` first makes each row fit.

    A refusal for content leaves that letter in place and goes on; an outage raises.
    """
    stmt = select(DeadLetter.id, DeadLetter.row).order_by(DeadLetter.id)
    if ids is not None:
        stmt = stmt.where(DeadLetter.id.in_(ids))
    async with engine.connect() as conn:
        letters = (await conn.execute(stmt)).all()
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    insert = dialect.insert(LedgerRow).on_conflict_do_nothing(index_elements=["request_id"])
    done = Replayed([], [])
    for letter_id, text in letters:
        row = row_from(json.loads(text))
        try:
            async with engine.begin() as conn:
                await conn.execute(insert, [(cleaned(row) if clean else row).values()])
                await conn.execute(delete(DeadLetter).where(DeadLetter.id == letter_id))
        except Exception as exc:
            if not refused_content(exc):
                raise
            done.refused.append({"id": letter_id, "error": _reason(exc)})
            continue
        done.written.append(letter_id)
    return done


_RANGES = {SmallInteger: 2**15 - 1, BigInteger: 2**63 - 1, Integer: 2**31 - 1}


def cleaned(row: Row) -> Row:
    """The row made to fit its columns: control characters removed from strings, strings
    cut to their column's length, integers clamped to their column's range."""
    values = row._asdict()
    for column in LedgerRow.__table__.columns:
        value = values.get(column.name)
        if isinstance(value, str) and isinstance(column.type, String):
            value = _UNSTORABLE.sub("", value)
            values[column.name] = value[: column.type.length] if column.type.length else value
        elif isinstance(value, int) and not isinstance(value, bool):
            top = next((v for t, v in _RANGES.items() if isinstance(column.type, t)), None)
            if top is not None:
                values[column.name] = min(max(value, -top - 1), top)
    return Row(**values)
