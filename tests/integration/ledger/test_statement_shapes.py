"""The embedded SQLite ledger prepares the same few statements whatever the batch size.

sqlite3 keeps the last 128 distinct statements prepared, by their text; one statement per
batch size (a multi-row insert) held hundreds of MB of prepared programs in a busy gateway.
The writer talks to aiosqlite directly, so the texts are read where it hands them over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import func, select

from gateway.flow import Cost, Usage
from gateway.ledger.db import make_engine
from gateway.ledger.migrate import upgrade
from gateway.ledger.models import LedgerRow
from gateway.ledger.rows import ledger_row
from gateway.ledger.store import RowSink
from tests.integration.ledger.factory import make_call


async def test_sqlite_batches_of_any_size_share_their_statements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/ledger.db")
    await upgrade(engine)
    seen: set[str] = set()
    for name in ("execute", "executemany", "execute_fetchall"):
        monkeypatch.setattr(aiosqlite.Connection, name, recording(name, seen))
    sink = RowSink(engine)
    sizes = range(1, 41)
    batches = [[make_call("alpha", usage=Usage(10, 0, 1)) for _ in range(n)] for n in sizes]
    try:
        for calls in batches:
            new = await sink.insert([ledger_row(c, Cost()) for c in calls])
            assert len(new) == len(calls)
        again = await sink.insert([ledger_row(c, Cost()) for c in batches[-1][:3]])
    finally:
        await sink.aclose()
        monkeypatch.undo()
    async with engine.connect() as conn:
        stored = (await conn.execute(select(func.count()).select_from(LedgerRow))).scalar_one()
    await engine.dispose()
    assert again == []  # a replayed batch is recognised as already written
    assert stored == sum(sizes)
    assert 1 <= len(seen) <= 4, seen


def recording(name: str, seen: set[str]) -> Any:
    """aiosqlite's method ``name``, noting the text of each statement handed to it."""
    method = getattr(aiosqlite.Connection, name)

    def spy(self: aiosqlite.Connection, sql: str, *args: Any) -> Any:
        seen.add(sql)
        return method(self, sql, *args)

    return spy
