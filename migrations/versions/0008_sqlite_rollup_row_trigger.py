"""SQLite: the rollup's insert trigger adds the new row's own values to its cells.

0007's SQLite triggers apply a row the way Postgres applies a statement's transition
table: each change runs the cells' GROUP BY over the row as a one-row table, twice per
rollup table (once to create missing cells, once to add). For an insert, the common
change, that cost more than inserting the row itself. This trigger reads ``NEW``
directly: it creates the row's cell (and its duration cells) at zero where missing, then
adds the row's counts and sums, each through the cell's unique index. The rollup it keeps
is the same to the unit; deletes and updates keep 0007's triggers.

The served/refused/failed rule and the duration count repeat 0007's literally. Postgres is
unchanged. Downgrading leaves this trigger: it keeps the rollup as 0007's did, and 0007's
downgrade drops it by the same name.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SERVED = "(NEW.status < 400 OR NEW.disconnected)"
COUNTS = {
    "requests": SERVED,
    "refused": f"NOT {SERVED} AND NEW.status < 500",
    "failed": f"NOT {SERVED} AND NEW.status >= 500",
}
SUMMED = ("prompt_tokens", "input_tokens", "cached_tokens", "cache_write_tokens",
          "completion_tokens", "cost_input", "cost_cached_input", "cost_cache_write",
          "cost_output", "cost_total", "cost_without_cache")  # fmt: skip
HOUR = "strftime('%Y-%m-%d %H:00:00.000000', NEW.ts)"  # how the ledger stores a timestamp
CELL = {"hour": HOUR, "model": "NEW.model", "backend": "NEW.backend"}
"""The row's cell: column -> its value for the row."""
DURATIONS = (
    (0, "NEW.ttft_s", f"{SERVED} AND NEW.stream AND NEW.ttft_s IS NOT NULL"),
    (1, "NEW.latency_s", f"{SERVED} AND NEW.latency_s IS NOT NULL"),
)
"""Each kind of duration counted, its value and when a row counts it."""


def counted_ms(seconds: str) -> str:
    """gateway.ledger.scorecard.duration_ms, as 0007 computes it on SQLite."""
    return (
        f"CASE WHEN {seconds} < 0.1 THEN CAST({seconds} * 1000 AS INTEGER) "
        f"WHEN {seconds} < 1 THEN CAST({seconds} * 100 AS INTEGER) * 10 "
        f"WHEN {seconds} < 10 THEN CAST({seconds} * 10 AS INTEGER) * 100 "
        f"ELSE CAST({seconds} AS INTEGER) * 1000 END"
    )


def create_then_add(
    table: str, cell: dict[str, str], values: dict[str, str], when: str = "1"
) -> list[str]:
    """Create the row's cell in ``table`` at zero where missing, then add ``values``
    (column -> what the row adds to it); neither where ``when`` is false for the row.
    No upsert: SQLite's unique index holds NULLs as distinct."""
    same = " AND ".join(f"{c} IS {v}" for c, v in cell.items())
    columns = ", ".join([*cell, *values])
    zeros = ", 0" * len(values)
    added = ", ".join(f"{c} = {c} + {v}" for c, v in values.items())
    return [
        f"INSERT INTO {table} ({columns}) SELECT {', '.join(cell.values())}{zeros} "
        f"WHERE {when} AND NOT EXISTS (SELECT 1 FROM {table} WHERE {same})",
        f"UPDATE {table} SET {added} WHERE {when} AND {same}",
    ]


def add_trigger() -> str:
    counts = {n: f"CASE WHEN {rule} THEN 1 ELSE 0 END" for n, rule in COUNTS.items()}
    body = create_then_add("ledger_rollup", CELL, {**counts, **{n: f"NEW.{n}" for n in SUMMED}})
    for kind, seconds, when in DURATIONS:
        cell = {**CELL, "kind": str(kind), "ms": counted_ms(seconds)}
        body += create_then_add("ledger_rollup_durations", cell, {"n": "1"}, when)
    statements = "".join(f"  {s};\n" for s in body)
    return (
        "CREATE TRIGGER ledger_rollup_add AFTER INSERT ON ledger FOR EACH ROW BEGIN\n"
        f"{statements}END"
    )


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.execute("DROP TRIGGER ledger_rollup_add")
    op.execute(add_trigger())


def downgrade() -> None:
    pass
