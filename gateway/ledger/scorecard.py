"""The scorecard beside a cost report: how fast and how cache-efficient each group's calls were.

Price per token alone does not say what a deployment pays: that depends on how much of each
prompt was served from cache and how soon the first token came. From the same ledger rows a
report line gets the cached share of its prompt tokens, what caching saved as a share of
the uncached cost, the effective USD per million prompt and output tokens (what was billed
for them, divided by what was served), and the latency percentiles of its served calls.

Percentiles are computed in SQL, identically on Postgres and SQLite:

* A duration is counted in milliseconds to two significant digits, rounded down: whole
  milliseconds below 100 ms, tens below 1 s, hundreds below 10 s, whole seconds above
  (0.0875 s counts as 87 ms, 0.2468 s as 240 ms, 3.21 s as 3200 ms). That bounds the
  distinct values per group to a few hundred, so one GROUP BY gathers every group's whole
  distribution however many rows it holds (a millisecond count per row would make a hash
  table as large as the ledger), and the hourly rollup keeps each hour's distribution as
  the number of calls per counted value, which ranks exactly as the rows would.
* The p-th percentile of n counted durations is the nearest rank: the smallest value v
  such that at least p% of them are <= v (Postgres's ``percentile_disc``), picked in
  integers (``100 * at_or_below >= p * n``), so no float rounding can move a rank.

TTFT percentiles cover served streamed calls (a non-streamed answer's first byte is its
last); end-to-end covers every served call. The totals line's percentiles come from the
merged distributions, not from the lines' percentiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    case,
    cast,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.sql.expression import CTE

from gateway.ledger.models import QUANTUM, LedgerRow

SHARE = Decimal("0.0001")
"""Shares are fractions to four places (0.6250 is 62.50%)."""

PERCENTILES = (("ttft_p50_ms", "ttft", 50), ("ttft_p95_ms", "ttft", 95), ("e2e_p50_ms", "e2e", 50))
"""Each reported percentile: its figure, the duration it ranks, and p."""
RANKS = tuple(sorted({p for _, _, p in PERCENTILES}))
"""The p picked for every kind, in the order the percentile rows carry them."""

TTFT, E2E = 0, 1
KINDS = {"ttft": TTFT, "e2e": E2E}


def served() -> ColumnElement[bool]:
    """A call counted as served: answered below 400, or left by its client midway."""
    return or_(LedgerRow.status < 400, LedgerRow.disconnected)


def share(part: int | Decimal, whole: int | Decimal) -> Decimal | None:
    """part / whole to four places, half to even; None where there is no whole."""
    if not whole:
        return None
    with localcontext(prec=60):
        return (Decimal(part) / Decimal(whole)).quantize(SHARE)


def per_million(usd: Decimal, tokens: int) -> Decimal | None:
    """USD per million tokens at the ledger's 1e-10 scale, half to even; None for no tokens."""
    if not tokens:
        return None
    with localcontext(prec=60):
        return (usd * 1_000_000 / tokens).quantize(QUANTUM)


def _floor(x: ColumnElement[Any], dialect: str) -> ColumnElement[Any]:
    # SQLite's floor() is optional (math functions); a cast truncates, which for a
    # duration (never negative) is the same floor.
    return func.floor(x) if dialect == "postgresql" else cast(x, Integer)


def duration_ms(seconds: ColumnElement[Any], dialect: str) -> ColumnElement[Any]:
    """Milliseconds to two significant digits, rounded down (see the module docstring)."""
    return case(
        (seconds < 0.1, _floor(seconds * 1000, dialect)),
        (seconds < 1, _floor(seconds * 100, dialect) * 10),
        (seconds < 10, _floor(seconds * 10, dialect) * 100),
        else_=_floor(seconds, dialect) * 1000,
    )


def duration_counts(
    dialect: str, groups: list[ColumnElement[Any]], where: list[ColumnElement[bool]]
) -> list[Select[Any]]:
    """Per group, kind (TTFT or end-to-end) and counted duration, the number of served
    calls among the rows: rows of (g0.., k, v, n).

    One GROUP BY per kind, each over only the rows it ranks: on Postgres two narrow scans
    cost less than one that feeds every row through twice.
    """

    def counts(kind: int, seconds: ColumnElement[Any], *only: ColumnElement[bool]) -> Select[Any]:
        labelled = [g.label(f"g{i}") for i, g in enumerate(groups)]
        value = duration_ms(seconds, dialect)
        return (
            select(*labelled, literal(kind).label("k"), value.label("v"), func.count().label("n"))
            .where(served(), seconds.is_not(None), *only, *where)
            .group_by(*labelled, value)
        )

    ttft = counts(TTFT, LedgerRow.ttft_s.expression, LedgerRow.stream.expression)
    return [ttft, counts(E2E, LedgerRow.latency_s.expression)]


def _picks(hist: CTE, n_groups: int, total: bool) -> Select[Any]:
    """Each partition's percentiles from its counts: a running sum picks the nearest rank
    (a duration counted in several rows of a partition is one peer of the window's order).
    By group, or (total) over all groups merged, with NULL in the group columns."""
    keys = [] if total else [hist.c[f"g{i}"] for i in range(n_groups)]
    part = [*keys, hist.c.k]
    ranked = select(
        *keys,
        hist.c.k,
        hist.c.v,
        func.sum(hist.c.n).over(partition_by=part, order_by=hist.c.v).label("cum"),
        func.sum(hist.c.n).over(partition_by=part).label("tot"),
    ).subquery("ranked")
    picks = [
        func.min(case((100 * ranked.c.cum >= p * ranked.c.tot, ranked.c.v))).label(f"p{p}")
        for p in RANKS
    ]
    outer = [ranked.c[k.name] for k in keys]
    cols = outer if not total else [null().label(f"g{i}") for i in range(n_groups)]
    return select(literal(total).label("total"), *cols, ranked.c.k, *picks).group_by(
        *outer, ranked.c.k
    )


def percentile_query(counts: list[Select[Any]], n_groups: int) -> Select[Any]:
    """Rows of (total, group values..., kind, p50, p95) from duration counts (each a select
    of g0.., k, v, n): one per group and kind, then one per kind for the totals line
    (group values NULL, total true)."""
    hist = union_all(*counts).cte("histogram")
    by_group, overall = _picks(hist, n_groups, False), _picks(hist, n_groups, True)
    return select(union_all(by_group, overall).subquery("picks"))


@dataclass(frozen=True, slots=True)
class Latency:
    """A group's percentiles in milliseconds (None: no served call to rank)."""

    ttft_p50_ms: int | None = None
    ttft_p95_ms: int | None = None
    e2e_p50_ms: int | None = None


def latencies(
    rows: list[Any], n_groups: int
) -> tuple[Mapping[tuple[str | None, ...], Latency], Latency]:
    """The percentile rows as Latency by group values, and the totals line's."""
    found: dict[tuple[bool, tuple[str | None, ...]], dict[str, int | None]] = {}
    for r in rows:
        groups = tuple(None if g is None else str(g) for g in r[1 : 1 + n_groups])
        kind, by_p = r[1 + n_groups], dict(zip(RANKS, r[2 + n_groups :], strict=True))
        figures = found.setdefault((bool(r[0]), groups), {})
        for name, k, p in PERCENTILES:
            if KINDS[k] == kind and by_p[p] is not None:
                figures[name] = int(by_p[p])
    lines = {g: Latency(**f) for (total, g), f in found.items() if not total}
    totals = next((Latency(**f) for (total, _), f in found.items() if total), Latency())
    return lines, totals
