"""Cost reports: the ledger aggregated in SQL by key, team, model, day or backend.

Sums run in the database (one GROUP BY over the ts-indexed ledger); the totals line is the
exact sum of the group lines, so a report always adds up to the last digit.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal, get_args

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.models import LedgerRow

GroupBy = Literal["key", "team", "model", "day", "backend"]
GROUP_BYS: tuple[str, ...] = get_args(GroupBy)

TOKENS = ("prompt_tokens", "input_tokens", "cached_tokens", "cache_write_tokens",
          "completion_tokens")  # fmt: skip
COSTS = ("cost_input", "cost_cached_input", "cost_cache_write", "cost_output", "cost_total",
         "cost_without_cache")  # fmt: skip


@dataclass(slots=True)
class ReportLine:
    group: str | None
    requests: int = 0
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
        for name in ("requests", *TOKENS, *COSTS):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["savings"] = self.savings
        return {k: format(v, "f") if isinstance(v, Decimal) else v for k, v in out.items()}


@dataclass(slots=True)
class Report:
    start: datetime | None
    end: datetime | None
    group_by: GroupBy
    lines: list[ReportLine]
    totals: ReportLine

    def to_json(self) -> dict[str, Any]:
        """Money as decimal strings, so no JSON parser turns it into a float."""
        return {
            "from": self.start.isoformat() if self.start else None,
            "to": self.end.isoformat() if self.end else None,
            "group_by": self.group_by,
            "currency": "USD",
            "rows": [line.as_dict() for line in self.lines],
            "totals": self.totals.as_dict(),
        }

    def to_csv(self) -> str:
        """One line per group and a last line whose group is TOTAL."""
        buf = io.StringIO()
        header = [*ReportLine.__dataclass_fields__, "savings"]
        header[0] = self.group_by
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        for line in [*self.lines, self.totals]:
            writer.writerow(line.as_dict().values())
        return buf.getvalue()


def _group_column(group_by: GroupBy, dialect: str) -> ColumnElement[Any]:
    if group_by == "day":
        if dialect == "postgresql":
            return func.date(func.timezone("UTC", LedgerRow.ts))
        return func.date(LedgerRow.ts)
    return {
        "key": LedgerRow.key_id,
        "team": LedgerRow.team,
        "model": LedgerRow.model,
        "backend": LedgerRow.backend,
    }[group_by]


async def cost_report(
    engine: AsyncEngine, start: datetime | None, end: datetime | None, group_by: GroupBy
) -> Report:
    """Aggregate ledger rows with start <= ts < end (either bound optional)."""
    group = _group_column(group_by, engine.dialect.name).label("grp")
    sums = [func.sum(getattr(LedgerRow, name)).label(name) for name in (*TOKENS, *COSTS)]
    stmt = select(group, func.count().label("requests"), *sums).group_by(group).order_by(group)
    if start is not None:
        stmt = stmt.where(LedgerRow.ts >= start)
    if end is not None:
        stmt = stmt.where(LedgerRow.ts < end)
    async with engine.connect() as conn:
        result = await conn.execute(stmt)
        lines = [ReportLine(None if r.grp is None else str(r.grp), *r[1:]) for r in result.all()]
    totals = ReportLine("TOTAL")
    for line in lines:
        totals.add(line)
    return Report(start, end, group_by, lines, totals)


def parse_when(text: str) -> datetime:
    """An ISO date or datetime; naive ones are UTC. Raises ValueError on anything else."""
    when = datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=UTC)
