"""The hourly rollup's side of a report: whole hours from it, part hours from the rows.

The ledger's triggers (migrations 0007, 0008) keep ``ledger_rollup`` (counts and sums) and
``ledger_rollup_durations`` (served calls per counted duration) per UTC hour, model and
backend, in the transaction that writes the rows, so the rollup always says what the rows
say. A report whose groupings are all among :data:`DIMENSIONS` reads the hours that lie
wholly inside its period from the rollup and the rows themselves only for the part hours
at its edges; its answers are those of the rows, to the last unit and rank, because sums
add up and counted durations rank the same from their counts. Other groupings (key,
team, end user) are not in the rollup and read the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, Table, and_, func, literal_column, or_, select

from gateway.ledger.models import ROLLUP, ROLLUP_DURATIONS, ROLLUP_SUMS, LedgerRow

DIMENSIONS = frozenset({"day", "model", "backend"})
"""The groupings the rollup holds."""
HOUR = timedelta(hours=1)


def covers(group_by: Sequence[str]) -> bool:
    return set(group_by) <= DIMENSIONS


def utc_date(ts: Any, dialect: str) -> ColumnElement[Any]:
    """A timestamp's UTC day, the report's ``day``."""
    if dialect == "postgresql":
        # A literal, not a bind parameter: the migration's planner statistics are on
        # exactly this expression over the ledger's ts.
        return func.date(func.timezone(literal_column("'UTC'"), ts))
    return func.date(ts)


@dataclass(frozen=True, slots=True)
class Split:
    """A period [start, end) cut into whole UTC hours and the part hours around them."""

    hours: tuple[datetime | None, datetime | None] | None
    """The whole hours [first, end) (None: unbounded on that side); None if there are none."""
    edges: tuple[tuple[datetime | None, datetime | None], ...]
    """The rest, [start, end) each, for the rows."""

    def edge_rows(self) -> ColumnElement[bool] | None:
        """The rows of the part hours; None when there are none."""
        periods = [and_(*within(LedgerRow.ts, a, b)) for a, b in self.edges]
        return or_(*periods) if periods else None


def within(column: Any, start: datetime | None, end: datetime | None) -> list[ColumnElement[bool]]:
    """start <= column < end, either bound optional."""
    return [*([] if start is None else [column >= start]), *([] if end is None else [column < end])]


def split(start: datetime | None, end: datetime | None) -> Split:
    first = None if start is None else _ceil_hour(start)
    last = None if end is None else _floor_hour(end)
    if first is not None and last is not None and first >= last:
        return Split(None, ((start, end),))
    edges = ([] if start is None or start == first else [(start, first)]) + (
        [] if end is None or end == last else [(last, end)]
    )
    return Split((first, last), tuple(edges))


def _floor_hour(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _ceil_hour(when: datetime) -> datetime:
    floor = _floor_hour(when)
    return floor if floor == when else floor + HOUR


def _cells(table: Table, group_by: Sequence[str], hours: tuple[datetime | None, datetime | None],
           dialect: str) -> tuple[list[ColumnElement[Any]], list[ColumnElement[bool]]]:  # fmt: skip
    """The group columns on a rollup table, and its rows within the whole hours."""
    groups = [utc_date(table.c.hour, dialect) if g == "day" else table.c[g] for g in group_by]
    return groups, within(table.c.hour, *hours)


def sums(
    dialect: str, group_by: Sequence[str], hours: tuple[datetime | None, datetime | None]
) -> Select[Any]:
    """The cells' counts and sums, labelled as the report's (group columns ``g_<name>``)."""
    groups, where = _cells(ROLLUP, group_by, hours, dialect)
    labelled = [g.label(f"g_{name}") for g, name in zip(groups, group_by, strict=True)]
    return select(*labelled, *(ROLLUP.c[n] for n in ROLLUP_SUMS)).where(*where)


def duration_counts(
    dialect: str, group_by: Sequence[str], hours: tuple[datetime | None, datetime | None]
) -> Select[Any]:
    """Served calls per group, kind and counted duration, labelled as the scorecard's."""
    t = ROLLUP_DURATIONS
    groups, where = _cells(t, group_by, hours, dialect)
    labelled = [g.label(f"g{i}") for i, g in enumerate(groups)]
    return (
        select(*labelled, t.c.kind.label("k"), t.c.ms.label("v"), func.sum(t.c.n).label("n"))
        .where(*where)
        .group_by(*labelled, t.c.kind, t.c.ms)
    )
