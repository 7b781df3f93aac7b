"""The hourly rollup always equals an aggregate of the ledger's rows, and reports read
from it answer exactly as the rows do, on Postgres and SQLite.

Rows reach the ledger every way they can: the writer's batches, a batch written twice
(the merge that skips rows already there), a spool replayed at start, a poisoned row set
aside and its dead letter replayed cleaned, an UPDATE and a DELETE by hand. After each,
the rollup is checked against the rows, aggregated here in Python.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import ColumnElement, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.flow import Call, Cost, Usage
from gateway.ledger import Ledger, deadletters
from gateway.ledger.models import COST_COLUMNS, ROLLUP, ROLLUP_DURATIONS, TOKEN_COLUMNS, LedgerRow
from gateway.ledger.report import (
    GroupBy,
    report_query,
    rollup_report_query,
    scorecard_query,
)
from gateway.ledger.rollup import utc_date, within
from gateway.ledger.rows import Row, ledger_row
from gateway.ledger.scorecard import duration_counts, percentile_query
from gateway.ledger.spool import Spool
from gateway.ledger.store import insert_rows
from tests.integration.ledger.factory import ledger_settings, make_call
from tests.integration.ledger.test_dead_letters import metric, poisoned
from tests.integration.ledger.test_migrate import migrate_to
from tests.polling import eventually

PRICES = {"alpha": {"input": "0.15", "cached_input": "0.075", "output": "0.60"},
          "beta": {"input": "1", "cached_input": "0.1", "output": "2"}}  # fmt: skip
HOUR0 = 1_790_812_800.0  # 2026-10-01 00:00 UTC

CellKey = tuple[datetime, str | None, str | None]


def varied_call(i: int) -> Call:
    """Calls over five hours (and across midnight), two models, three backends and none,
    every status class and its edges, streamed or not, durations on both sides of the
    counts' bounds."""
    status = (200, 200, 200, 429, 502, 499, 500, 399, 400)[i % 9]
    call = make_call(
        ("alpha", "beta")[i % 2],
        usage=Usage(prompt_tokens=100 + i, cached_tokens=i % 50, completion_tokens=i % 7),
        stream=i % 3 != 0,
        status=status,
        disconnected=status == 499,
        received_wall=HOUR0 - 5400 + i * 97.3,
        backend=("b1", "b2", "b3")[i % 3],
    )
    if i % 11 == 0:
        call.route = None  # never routed: no backend
    ttft = (0.0999, 0.1, 0.29, 0.0123, 1.5, 9.99, 10.0, 27.3)[i % 8] + i * 1e-5
    call.first_byte_at = call.received_at + ttft
    call.done_at = None if i % 13 == 0 else call.first_byte_at + (i % 9) * 0.37
    return call


def counted_ms(seconds: float) -> float:
    """The scorecard's count of a duration, worked out here in the databases' doubles."""
    if seconds < 0.1:
        return math.floor(seconds * 1000)
    if seconds < 1:
        return math.floor(seconds * 100) * 10
    if seconds < 10:
        return math.floor(seconds * 10) * 100
    return math.floor(seconds) * 1000


def expected(rows: Sequence[Any]) -> tuple[dict[CellKey, list[int]], dict[Any, int]]:
    """The rollup's cells from the rows: sums, and served calls per kind and count."""
    sums: dict[CellKey, list[int]] = defaultdict(lambda: [0] * 14)
    counts: Counter[Any] = Counter()
    for r in rows:
        cell = (r.ts.replace(minute=0, second=0, microsecond=0), r.model, r.backend)
        ok = r.status < 400 or r.disconnected
        flags = [ok, not ok and r.status < 500, not ok and r.status >= 500]
        values = [*map(int, flags), *(getattr(r, c) for c in (*TOKEN_COLUMNS, *COST_COLUMNS))]
        sums[cell] = [a + b for a, b in zip(sums[cell], values, strict=True)]
        if ok and r.stream and r.ttft_s is not None:
            counts[(*cell, 0, counted_ms(r.ttft_s))] += 1
        if ok and r.latency_s is not None:
            counts[(*cell, 1, counted_ms(r.latency_s))] += 1
    return dict(sums), dict(counts)


async def rollup_now(engine: AsyncEngine) -> tuple[dict[CellKey, list[int]], dict[Any, int]]:
    async with engine.connect() as conn:
        cells = (await conn.execute(select(ROLLUP))).all()
        durations = (await conn.execute(select(ROLLUP_DURATIONS))).all()
    sums = {(r.hour, r.model, r.backend): [int(v) for v in r[3:]] for r in cells}
    counts = {(r.hour, r.model, r.backend, r.kind, r.ms): r.n for r in durations}
    return sums, counts


async def assert_rollup_is_the_rows(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(LedgerRow))).all()
    assert await rollup_now(engine) == expected(rows)


PERIODS = [
    (None, None),
    (datetime(2026, 9, 30, 23, 30, tzinfo=UTC), datetime(2026, 10, 1, 2, 15, tzinfo=UTC)),
    (datetime(2026, 10, 1, 0, 0, tzinfo=UTC), None),
    (None, datetime(2026, 10, 1, 1, 59, 59, tzinfo=UTC)),
    (datetime(2026, 10, 1, 1, 5, tzinfo=UTC), datetime(2026, 10, 1, 1, 55, tzinfo=UTC)),
]
"""Whole hours with part hours at either edge or both, none, and a period in one hour."""
GROUPINGS: list[tuple[GroupBy, ...]] = [("backend",), ("model", "day"), ("backend", "day")]


async def assert_reports_are_the_rows(engine: AsyncEngine) -> None:
    """Every grouping the rollup holds, over periods cut anywhere, answers as the rows."""
    dialect = engine.dialect.name
    async with engine.connect() as conn:
        for start, end in PERIODS:
            for group_by in GROUPINGS:
                over_rows = report_query(dialect, start, end, group_by)
                from_rollup = rollup_report_query(dialect, start, end, group_by)
                rows = [tuple(r) for r in (await conn.execute(over_rows)).all()]
                assert [tuple(r) for r in (await conn.execute(from_rollup)).all()] == rows
                picks = await percentiles(conn, scorecard_query(dialect, start, end, group_by))
                assert picks == await percentiles(conn, rows_percentiles(dialect, start, end,
                                                                         group_by))  # fmt: skip


def rows_percentiles(
    dialect: str, start: datetime | None, end: datetime | None, group_by: tuple[GroupBy, ...]
) -> Any:
    """The scorecard's percentiles over the rows alone, as for groupings not rolled up."""
    column: dict[str, ColumnElement[Any]] = {"backend": LedgerRow.backend.expression,
                                             "model": LedgerRow.model.expression}  # fmt: skip
    groups = [column[g] if g in column else utc_date(LedgerRow.ts, dialect) for g in group_by]
    where = within(LedgerRow.ts, start, end)
    return percentile_query(duration_counts(dialect, groups, where), len(groups))


async def percentiles(conn: Any, query: Any) -> list[tuple[Any, ...]]:
    """The percentile rows in a fixed order (a count may come back 100 or 100.0)."""
    rows = [tuple(r) for r in (await conn.execute(query)).all()]
    return sorted(rows, key=lambda r: [str(v) for v in r[:-2]])


async def written(db_url: str, tmp_path: Path, rows: list[Row]) -> CollectorRegistry:
    """Rows through a running ledger's writer, until all are committed or set aside."""
    registry = CollectorRegistry()
    ledger = Ledger(ledger_settings(db_url, tmp_path / "spool", PRICES, batch_size=37), registry)
    await ledger.start()
    assert ledger._writer is not None
    for row in rows:
        ledger._writer.put(row)
    await eventually(
        lambda: ledger._writer is not None and ledger._writer.depth == ledger.spooled == 0,
        within=30,
    )
    await ledger.aclose()
    return registry


async def test_the_rollup_follows_every_way_rows_are_written_and_changed(
    db_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    calls = [varied_call(i) for i in range(300)]
    rows = [ledger_row(c, Cost(input=7 * i, cached_input=i, output=3 * i, total=11 * i,
                               without_cache=13 * i)) for i, c in enumerate(calls)]  # fmt: skip
    bad = poisoned(db_url)  # in a cell of its own: SQLite's is a cost no other sums with
    bad = bad._replace(model=str(bad.model).replace("alpha", "poison"), backend="b-poison")

    await written(db_url, tmp_path, [*rows[:100], bad, *rows[100:150]])  # batches of 37
    assert [x.request_id for x in await deadletters.listing(engine)] == [bad.request_id]
    await assert_rollup_is_the_rows(engine)

    assert await insert_rows(engine, rows[120:180]) == rows[150:180]  # 30 of 60 new: merged
    assert await insert_rows(engine, rows[120:180]) == []  # replayed again: nothing new
    await assert_rollup_is_the_rows(engine)

    spool = Spool(tmp_path / "spool")  # left by an earlier run, some rows written already
    spool.open()
    spool.append(rows[170:300])
    spool.close()
    registry = await written(db_url, tmp_path, [])
    assert metric(registry, "gateway_ledger_spool_rows") == 0
    await assert_rollup_is_the_rows(engine)

    replayed = await deadletters.replay(engine, clean=True)
    assert len(replayed.written) == 1
    async with engine.begin() as conn:
        moved = "UPDATE ledger SET status = 503, backend = 'b9' WHERE id % 7 = 0"
        await conn.execute(text(f"{moved} AND model <> 'poison'"))
        await conn.execute(text("DELETE FROM ledger WHERE id % 5 = 0"))
    await assert_rollup_is_the_rows(engine)
    await assert_reports_are_the_rows(engine)


async def test_the_migration_counts_the_rows_already_there(engine: AsyncEngine) -> None:
    await migrate_to(engine, "0006", down=True)
    await insert_rows(engine, [ledger_row(varied_call(i), Cost(total=i)) for i in range(120)])
    await migrate_to(engine, "head")
    await assert_rollup_is_the_rows(engine)
    await assert_reports_are_the_rows(engine)
    emptied = "TRUNCATE ledger" if engine.dialect.name == "postgresql" else "DELETE FROM ledger"
    async with engine.begin() as conn:
        await conn.execute(text(emptied))
    assert await rollup_now(engine) == ({}, {})
