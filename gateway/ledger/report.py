"""Cost reports: the ledger aggregated in SQL by key, team, model, day or backend.

A report groups by one dimension or several (``team,day``). Sums run in the database, one
GROUP BY over the ledger, in the integer 1e-10 USD units the rows hold, and become
``Decimal`` USD at that scale here; the totals line is the exact sum of the group lines, so
a report always adds up to the last digit. A report grouped by day, model or backend only
reads the hourly rollup for the whole hours of its period and the rows for the rest
(:mod:`gateway.ledger.rollup`), with the same answers.

``requests`` counts the calls served (answered below 400, or left by their client midway);
``refused`` the calls answered 4xx (a bad key, a limit, bad input, or a backend that
refused the request) and ``failed`` those answered 5xx (no backend, a backend's failure, a
timeout): their rows are in the ledger, but they are not requests a bill counts.

Beside the money every line carries its scorecard (:mod:`gateway.ledger.scorecard`):
cache and savings shares, effective prices per million tokens, latency percentiles. A
report by backend or by model alone lists the cheapest effective prompt price first (then
the fastest TTFT), since those lines are compared with each other.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal, cast, get_args

from sqlalchemy import ColumnElement, Select, case, func, select, text, union_all
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger import rollup
from gateway.ledger.models import COST_COLUMNS, TOKEN_COLUMNS, LedgerRow, to_usd
from gateway.ledger.scorecard import (
    PERCENTILES,
    Latency,
    duration_counts,
    latencies,
    per_million,
    percentile_query,
    served,
    share,
)

GroupBy = Literal["key", "team", "model", "day", "backend", "user"]
GROUP_BYS: tuple[str, ...] = get_args(GroupBy)

TOKENS, COSTS = TOKEN_COLUMNS, COST_COLUMNS
COUNTS = ("requests", "refused", "failed", *TOKENS)
SCORES = ("cached_share", "savings_share", "usd_per_m_prompt", "usd_per_m_output")
FIGURES = (*COUNTS[:3], *TOKENS, *COSTS, "savings", *SCORES, *(p for p, _, _ in PERCENTILES))
COMPARED: tuple[tuple[GroupBy, ...], ...] = (("backend",), ("model",))
"""Groupings whose lines are alternatives to one another: ordered best first."""


@dataclass(slots=True)
class ReportLine:
    groups: tuple[str | None, ...] = ()
    requests: int = 0
    refused: int = 0
    failed: int = 0
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
    latency: Latency = field(default_factory=Latency)

    @property
    def savings(self) -> Decimal:
        """What caching saved: the cost without cached tokens minus what was billed."""
        return self.cost_without_cache - self.cost_total

    @property
    def cached_share(self) -> Decimal | None:
        """Cached tokens as a share of prompt tokens."""
        return share(self.cached_tokens, self.prompt_tokens)

    @property
    def savings_share(self) -> Decimal | None:
        """What caching saved as a share of what the calls would have cost uncached."""
        return share(self.savings, self.cost_without_cache)

    @property
    def usd_per_m_prompt(self) -> Decimal | None:
        """Billed for prompt tokens (standard, cached, cache write) per million of them."""
        billed = self.cost_input + self.cost_cached_input + self.cost_cache_write
        return per_million(billed, self.prompt_tokens)

    @property
    def usd_per_m_output(self) -> Decimal | None:
        return per_million(self.cost_output, self.completion_tokens)

    def add(self, other: ReportLine) -> None:
        for name in (*COUNTS, *COSTS):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def figures(self) -> dict[str, Any]:
        """Counts as ints, money and shares as fixed-point strings (no JSON parser turns
        them to floats), None where a figure has nothing to divide or rank."""
        own = {name: getattr(self, name) for name in FIGURES[: -len(PERCENTILES)]}
        out = own | {name: getattr(self.latency, name) for name, _, _ in PERCENTILES}
        return {k: format(v, "f") if isinstance(v, Decimal) else v for k, v in out.items()}

    def rank_key(self) -> tuple[Decimal, int]:
        """Cheapest effective prompt price first, then fastest TTFT; lines without one last."""
        price, ttft = self.usd_per_m_prompt, self.latency.ttft_p50_ms
        return (Decimal("Infinity") if price is None else price,
                2**62 if ttft is None else ttft)  # fmt: skip


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
            writer.writerow([*line.groups, *_cells(line)])
        blanks = [""] * (len(self.group_by) - 1)
        writer.writerow(["TOTAL", *blanks, *_cells(self.totals)])
        return buf.getvalue()

    def to_table(self) -> str:
        """A terminal's view: the scorecard beside what was billed (CSV and JSON carry
        every figure). In a comparison (by backend or model) a * marks the cheapest
        effective prompt price and the fastest TTFT p50."""
        names = [*self.group_by, *TABLE]
        rows = [[*(g or "(none)" for g in line.groups), *_row(line)] for line in self.lines]
        if self.group_by in COMPARED and self.lines:
            _mark_best(rows, len(self.group_by), self.lines)
        rows.append(["TOTAL", *[""] * (len(self.group_by) - 1), *_row(self.totals)])
        widths = [max(len(c) for c in col) for col in zip(names, *rows, strict=True)]
        out = [_aligned(names, widths)] + [_aligned(r, widths) for r in rows]
        return "\n".join(out) + "\n"


TABLE = ("served", "refused", "failed", "billed_usd", "cached", "saved", "usd/M_prompt",
         "usd/M_output", "ttft_p50_ms", "ttft_p95_ms", "e2e_p50_ms")  # fmt: skip


def _row(line: ReportLine) -> list[str]:
    lat = line.latency
    cells = (line.requests, line.refused, line.failed, line.cost_total,
             _percent(line.cached_share), _percent(line.savings_share), line.usd_per_m_prompt,
             line.usd_per_m_output, lat.ttft_p50_ms, lat.ttft_p95_ms, lat.e2e_p50_ms)  # fmt: skip
    return ["-" if c is None else format(c, "f") if isinstance(c, Decimal) else str(c)
            for c in cells]  # fmt: skip


def _percent(value: Decimal | None) -> str | None:
    return None if value is None else f"{value * 100:.2f}%"


def _mark_best(rows: list[list[str]], n: int, lines: list[ReportLine]) -> None:
    """Star the cheapest effective prompt price and the fastest TTFT p50 (ties: all)."""
    figures: dict[int, list[Decimal | None] | list[int | None]] = {
        n + TABLE.index("usd/M_prompt"): [line.usd_per_m_prompt for line in lines],
        n + TABLE.index("ttft_p50_ms"): [line.latency.ttft_p50_ms for line in lines],
    }
    for col, values in figures.items():
        known = [v for v in values if v is not None]
        for row, v in zip(rows, values, strict=True):
            if known and v == min(known):
                row[col] += " *"


def _aligned(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                     enumerate(zip(cells, widths, strict=True))).rstrip()  # fmt: skip


def _cells(line: ReportLine) -> list[Any]:
    return ["" if v is None else v for v in line.figures().values()]


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
        return rollup.utc_date(LedgerRow.ts, dialect)
    return {
        "key": LedgerRow.key_id,
        "team": LedgerRow.team,
        "model": LedgerRow.model,
        "backend": LedgerRow.backend,
        "user": LedgerRow.end_user,  # the end user's hash (keys/secret.py)
    }[group_by].expression


def _groups(dialect: str, group_by: tuple[GroupBy, ...]) -> list[ColumnElement[Any]]:
    return [_group_column(g, dialect) for g in group_by]


def _labelled(dialect: str, group_by: tuple[GroupBy, ...]) -> list[ColumnElement[Any]]:
    return [_group_column(g, dialect).label(f"g_{g}") for g in group_by]


def _period(start: datetime | None, end: datetime | None) -> list[ColumnElement[bool]]:
    return rollup.within(LedgerRow.ts, start, end)


def _sums(groups: list[ColumnElement[Any]], where: list[ColumnElement[bool]]) -> Select[Any]:
    """Counts and sums of the rows, per group (labelled ``g_<name>``)."""
    sums = [func.sum(getattr(LedgerRow, name)).label(name) for name in (*TOKENS, *COSTS)]
    ok = served()
    counts = (
        func.count(case((ok, 1))).label("requests"),
        func.count(case((~ok & (LedgerRow.status < 500), 1))).label("refused"),
        func.count(case((~ok & (LedgerRow.status >= 500), 1))).label("failed"),
    )
    return select(*groups, *counts, *sums).where(*where).group_by(*groups)


def report_query(
    dialect: str, start: datetime | None, end: datetime | None, group_by: tuple[GroupBy, ...]
) -> Select[Any]:
    """The report's counts and sums over the rows."""
    groups = _labelled(dialect, group_by)
    return _sums(groups, _period(start, end)).order_by(*groups)


def rollup_report_query(
    dialect: str, start: datetime | None, end: datetime | None, group_by: tuple[GroupBy, ...]
) -> Select[Any]:
    """The same counts and sums, from the rollup's whole hours and the rows of the rest."""
    cut = rollup.split(start, end)
    parts = [] if cut.hours is None else [rollup.sums(dialect, group_by, cut.hours)]
    edges = cut.edge_rows()
    if edges is not None:
        parts.append(_sums(_labelled(dialect, group_by), [edges]))
    both = union_all(*parts).subquery("parts")
    keys = [both.c[f"g_{g}"] for g in group_by]
    sums = [func.sum(both.c[n]).label(n) for n in (*COUNTS, *COSTS)]
    return select(*keys, *sums).group_by(*keys).order_by(*keys)


def scorecard_query(
    dialect: str, start: datetime | None, end: datetime | None, group_by: tuple[GroupBy, ...]
) -> Select[Any]:
    """The latency percentiles of the report's groups and of its totals line: from the
    rollup's whole hours and the rows of the rest where the rollup holds the groupings."""
    groups = _groups(dialect, group_by)
    if not rollup.covers(group_by):
        return percentile_query(duration_counts(dialect, groups, _period(start, end)), len(groups))
    cut = rollup.split(start, end)
    counts = [] if cut.hours is None else [rollup.duration_counts(dialect, group_by, cut.hours)]
    edges = cut.edge_rows()
    if edges is not None:
        counts += duration_counts(dialect, groups, [edges])
    return percentile_query(counts, len(groups))


def _line(r: Any, n: int) -> ReportLine:
    """A result row: n group values, the counts, the token sums, then the cost sums
    (units)."""
    groups = tuple(None if g is None else str(g) for g in r[:n])
    counts: list[Any] = [int(c) for c in r[n : n + len(COUNTS)]]  # the rollup's: Decimal
    return ReportLine(groups, *counts, *map(to_usd, r[n + len(COUNTS) :]))


async def cost_report(
    engine: AsyncEngine,
    start: datetime | None,
    end: datetime | None,
    group_by: tuple[GroupBy, ...],
) -> Report:
    """Aggregate ledger rows with start <= ts < end (either bound optional)."""
    dialect, n = engine.dialect.name, len(group_by)
    async with engine.connect() as conn:
        if dialect == "postgresql":
            # The percentiles' GROUP BY holds a few hundred counts per group: at the default
            # 4 MB it spills to disk, which is much slower.
            await conn.execute(text("SET LOCAL work_mem = '64MB'"))
        sums = rollup_report_query if rollup.covers(group_by) else report_query
        result = await conn.execute(sums(dialect, start, end, group_by))
        lines = [_line(r, n) for r in result.all()]
        picks = await conn.execute(scorecard_query(dialect, start, end, group_by))
        by_group, overall = latencies(list(picks.all()), n)
    report = Report(start, end, group_by, lines)
    for line in lines:
        report.totals.add(line)
        line.latency = by_group.get(line.groups, Latency())
    report.totals.latency = overall
    if group_by in COMPARED:
        lines.sort(key=ReportLine.rank_key)
    return report
