"""Cost reports: the ledger aggregated in SQL by key, team, model, day or backend.

A report groups by one dimension or several (``team,day``). Sums run in the database, one
GROUP BY over the ledger, in the integer 1e-10 USD units the rows hold, and become
``Decimal`` USD at that scale here; the totals line is the exact sum of the group lines, so
a report always adds up to the last digit.

``requests`` counts the calls served (answered below 400, or left by their client midway);
``errors`` the calls answered with an error status, refused by the gateway (a bad key, a
limit, bad input) or failed by a backend: their rows are in the ledger, but they are not
requests a bill counts.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal, cast, get_args

from sqlalchemy import ColumnElement, Select, case, func, literal_column, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.models import LedgerRow, to_usd

GroupBy = Literal["key", "team", "model", "day", "backend"]
GROUP_BYS: tuple[str, ...] = get_args(GroupBy)

TOKENS = ("prompt_tokens", "input_tokens", "cached_tokens", "cache_write_tokens",
          "completion_tokens")  # fmt: skip
COSTS = ("cost_input", "cost_cached_input", "cost_cache_write", "cost_output", "cost_total",
         "cost_without_cache")  # fmt: skip
FIGURES = ("requests", "errors", *TOKENS, *COSTS, "savings")


@dataclass(slots=True)
class ReportLine:
    groups: tuple[str | None, ...] = ()
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    completion_tokens: int = 0
    cost_input: Decimal = Decimal(0)
    cost_cached_input: Decimal = Decimal(0)
    cost_cache_write: Decimal = Decimal(0)
    cost_output: Decimal = Decimal(0)
    cost_total: Decimal = Decimal(0)
    cost_without_cache: Decimal = Decimal(0)

    @property
    def savings(self) -> Decimal:
        """What caching saved: the cost without cached tokens minus what was billed."""
        return self.cost_without_cache - self.cost_total

    def add(self, other: ReportLine) -> None:
        for name in FIGURES[:-1]:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def figures(self) -> dict[str, Any]:
        """Counts as ints, money as fixed-point strings (no JSON parser turns them to floats)."""
        out = {name: getattr(self, name) for name in FIGURES}
        return {k: format(v, "f") if isinstance(v, Decimal) else v for k, v in out.items()}


@dataclass(slots=True)
class Report:
    start: datetime | None
    end: datetime | None
    group_by: tuple[GroupBy, ...]
    lines: list[ReportLine]
    totals: ReportLine = field(default_factory=ReportLine)

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.start.isoformat() if self.start else None,
            "to": self.end.isoformat() if self.end else None,
            "group_by": list(self.group_by),
            "currency": "USD",
            "rows": [
                dict(zip(self.group_by, line.groups, strict=True)) | line.figures()
                for line in self.lines
            ],
            "totals": self.totals.figures(),
        }

    def to_csv(self) -> str:
        """One line per group, then a line whose first group column says TOTAL."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow([*self.group_by, *FIGURES])
        for line in self.lines:
            writer.writerow([*line.groups, *line.figures().values()])
        blanks = [""] * (len(self.group_by) - 1)
        writer.writerow(["TOTAL", *blanks, *self.totals.figures().values()])
        return buf.getvalue()


def parse_group_by(text: str) -> tuple[GroupBy, ...]:
    """``team`` or ``team,day``: raises ValueError naming the allowed dimensions."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in GROUP_BYS]
    if bad or not names:
        raise ValueError(f"group_by must be one or more of {', '.join(GROUP_BYS)}: {text!r}")
    return cast(tuple[GroupBy, ...], names)


def parse_when(text: str) -> datetime:
    """An ISO date or datetime; naive ones are UTC. Raises ValueError on anything else."""
    when = datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _group_column(group_by: GroupBy, dialect: str) -> ColumnElement[Any]:
    if group_by == "day":
        if dialect == "postgresql":
            # A literal, not a bind parameter: the migration's planner statistics are on
            # exactly this expression.
            return func.date(func.timezone(literal_column("'UTC'"), LedgerRow.ts))
        return func.date(LedgerRow.ts)
    return {
        "key": LedgerRow.key_id,
        "team": LedgerRow.team,
        "model": LedgerRow.model,
        "backend": LedgerRow.backend,
    }[group_by]


def report_query(
    dialect: str, start: datetime | None, end: datetime | None, group_by: tuple[GroupBy, ...]
) -> Select[Any]:
    groups = [_group_column(g, dialect).label(f"g_{g}") for g in group_by]
    sums = [func.sum(getattr(LedgerRow, name)).label(name) for name in (*TOKENS, *COSTS)]
    served = or_(LedgerRow.status < 400, LedgerRow.disconnected)
    counts = (
        func.count(case((served, 1))).label("requests"),
        func.count(case((~served, 1))).label("errors"),
    )
    stmt = select(*groups, *counts, *sums)
    stmt = stmt.group_by(*groups).order_by(*groups)
    if start is not None:
        stmt = stmt.where(LedgerRow.ts >= start)
    if end is not None:
        stmt = stmt.where(LedgerRow.ts < end)
    return stmt


def _line(r: Any, n: int) -> ReportLine:
    """A result row: n group values, the two counts, the token sums, then the cost sums
    (units)."""
    groups = tuple(None if g is None else str(g) for g in r[:n])
    counts = r[n : n + 2 + len(TOKENS)]
    return ReportLine(groups, *counts, *map(to_usd, r[n + 2 + len(TOKENS) :]))


async def cost_report(
    engine: AsyncEngine,
    start: datetime | None,
    end: datetime | None,
    group_by: tuple[GroupBy, ...],
) -> Report:
    """Aggregate ledger rows with start <= ts < end (either bound optional)."""
    stmt = report_query(engine.dialect.name, start, end, group_by)
    n = len(group_by)
    async with engine.connect() as conn:
        result = await conn.execute(stmt)
        lines = [_line(r, n) for r in result.all()]
    report = Report(start, end, group_by, lines)
    for line in lines:
        report.totals.add(line)
    return report
