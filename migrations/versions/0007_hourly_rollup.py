"""The ledger added up per UTC hour, model and backend, kept by triggers on the ledger.

``ledger_rollup`` holds each cell's counts and sums, ``ledger_rollup_durations`` how many
served calls took each counted duration (milliseconds to two significant digits, rounded
down, as gateway.ledger.scorecard counts them). Reports read whole hours from here and the
rows themselves only for the part hours at a period's edges.

The triggers change the rollup in the statement (and so the transaction) that changes the
rows, whoever writes them: the writer's COPY, its ON CONFLICT DO NOTHING merge of a
replayed batch (only the rows it inserts reach the trigger), a dead letter's replay, an
operator's UPDATE, DELETE or TRUNCATE. Postgres runs one statement-level trigger per
statement on its transition table, upserting cells in key order so that writers meeting
on a cell never deadlock; SQLite, which has row triggers only, applies each row. The
backfill runs after the triggers exist: on Postgres creating them locks out writers until
this migration commits, so no row is counted twice or missed.

The SQL repeats the scorecard's duration count and the report's served/refused/failed
rule literally: a change there needs a migration that rebuilds the rollup. On SQLite a
later migration that rebuilds the ledger table (batch mode) drops these triggers and must
create them again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNITS = sa.BigInteger().with_variant(sa.Numeric(38, 0), "postgresql")
SERVED = "(status < 400 OR disconnected)"
COUNTS = {
    "requests": SERVED,
    "refused": f"NOT {SERVED} AND status < 500",
    "failed": f"NOT {SERVED} AND status >= 500",
}
SUMMED = ("prompt_tokens", "input_tokens", "cached_tokens", "cache_write_tokens",
          "completion_tokens", "cost_input", "cost_cached_input", "cost_cache_write",
          "cost_output", "cost_total", "cost_without_cache")  # fmt: skip
SUMS = (*COUNTS, *SUMMED)
CELL = ("hour", "model", "backend")
DURATION_CELL = (*CELL, "kind", "ms")
READ = ("ts", "model", "backend", "status", "disconnected", "stream", "ttft_s", "latency_s",
        *SUMMED)  # fmt: skip
"""The ledger columns the rollup reads."""
TABLES = ("ledger_rollup", "ledger_rollup_durations")


def hour(dialect: str) -> str:
    if dialect == "postgresql":
        return "date_trunc('hour', ts, 'UTC')"
    return "strftime('%Y-%m-%d %H:00:00.000000', ts)"  # how the ledger stores a timestamp


def counted_ms(dialect: str, seconds: str) -> str:
    """gateway.ledger.scorecard.duration_ms, as the report's SQL computes it."""

    def floor(x: str) -> str:
        return f"floor({x})" if dialect == "postgresql" else f"CAST({x} AS INTEGER)"

    return (
        f"CASE WHEN {seconds} < 0.1 THEN {floor(f'{seconds} * 1000')} "
        f"WHEN {seconds} < 1 THEN {floor(f'{seconds} * 100')} * 10 "
        f"WHEN {seconds} < 10 THEN {floor(f'{seconds} * 10')} * 100 "
        f"ELSE {floor(seconds)} * 1000 END"
    )


def sums(dialect: str, rows: str, sign: str = "") -> str:
    """Each cell's counts and sums over ``rows`` (negated with sign '-')."""
    counts = [f"{sign}count(CASE WHEN {rule} THEN 1 END) AS {n}" for n, rule in COUNTS.items()]
    summed = [f"{sign}sum({n}) AS {n}" for n in SUMMED]
    return (
        f"SELECT {hour(dialect)} AS hour, model, backend, {', '.join([*counts, *summed])} "
        f"FROM {rows} AS r GROUP BY 1, 2, 3"
    )


def durations(dialect: str, rows: str, sign: str = "") -> str:
    """Each cell's served calls per kind and counted duration over ``rows``."""
    ranked = (
        (0, "ttft_s", f"{SERVED} AND stream AND ttft_s IS NOT NULL"),
        (1, "latency_s", f"{SERVED} AND latency_s IS NOT NULL"),
    )
    parts = " UNION ALL ".join(
        f"SELECT {hour(dialect)} AS hour, model, backend, {kind} AS kind, "
        f"{counted_ms(dialect, seconds)} AS ms FROM {rows} AS r WHERE {where}"
        for kind, seconds, where in ranked
    )
    cell = ", ".join(DURATION_CELL)
    return f"SELECT {cell}, {sign}count(*) AS n FROM ({parts}) AS d GROUP BY {cell}"


def merge_pg(table: str, cell: Sequence[str], values: Sequence[str], select: str) -> list[str]:
    """Add a select's cells to the table: one upsert, in key order."""
    added = ", ".join(f"{v} = t.{v} + excluded.{v}" for v in values)
    return [
        f"INSERT INTO {table} AS t ({', '.join([*cell, *values])}) {select} "
        f"ORDER BY {', '.join(cell)} ON CONFLICT ({', '.join(cell)}) DO UPDATE SET {added}"
    ]


def merge_sqlite(table: str, cell: Sequence[str], values: Sequence[str], select: str) -> list[str]:
    """Add a select's cells to the table: create the missing cells at zero, then add.

    No upsert: SQLite's unique index holds NULLs as distinct. Writers take turns on
    SQLite, so nobody can create a cell in between.
    """
    same = " AND ".join(f"{table}.{c} IS a.{c}" for c in cell)
    zeros = ", ".join(f"a.{c}" for c in cell) + ", 0" * len(values)
    added = ", ".join(f"{v} = {table}.{v} + a.{v}" for v in values)
    return [
        f"INSERT INTO {table} ({', '.join([*cell, *values])}) SELECT {zeros} FROM ({select}) "
        f"AS a WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE {same})",
        f"UPDATE {table} SET {added} FROM ({select}) AS a WHERE {same}",
    ]


def apply(dialect: str, rows: str, sign: str = "") -> list[str]:
    """The statements that add ``rows`` to the rollup (subtract them with sign '-', and
    drop the cells left empty)."""
    merge = merge_pg if dialect == "postgresql" else merge_sqlite
    statements = [
        *merge("ledger_rollup", CELL, SUMS, sums(dialect, rows, sign)),
        *merge("ledger_rollup_durations", DURATION_CELL, ("n",), durations(dialect, rows, sign)),
    ]
    if sign:
        touched = f"hour IN (SELECT {hour(dialect)} FROM {rows} AS r)"
        statements += [
            f"DELETE FROM ledger_rollup WHERE {touched} AND {' + '.join(COUNTS)} = 0",
            f"DELETE FROM ledger_rollup_durations WHERE {touched} AND n = 0",
        ]
    return statements


def triggers_pg() -> list[str]:
    """A plpgsql function and a statement trigger per change, on its transition tables."""
    pg = "postgresql"
    changes = {
        "add": ("INSERT", "NEW TABLE AS added", apply(pg, "added")),
        "remove": ("DELETE", "OLD TABLE AS removed", apply(pg, "removed", "-")),
        "replace": ("UPDATE", "OLD TABLE AS removed NEW TABLE AS added",
                    [*apply(pg, "removed", "-"), *apply(pg, "added")]),
        "clear": ("TRUNCATE", "", [f"TRUNCATE {', '.join(TABLES)}"]),
    }  # fmt: skip
    out = []
    for name, (event, tables, body) in changes.items():
        statements = "".join(f"  {s};\n" for s in body)
        out += [
            f"CREATE FUNCTION ledger_rollup_{name}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
            f"BEGIN\n{statements}  RETURN NULL;\nEND $$",
            f"CREATE TRIGGER ledger_rollup_{name} AFTER {event} ON ledger "
            f"{'REFERENCING ' + tables if tables else ''} FOR EACH STATEMENT "
            f"EXECUTE FUNCTION ledger_rollup_{name}()",
        ]
    return out


def triggers_sqlite() -> list[str]:
    """A row trigger per change: the row as a one-row table, applied as Postgres does."""

    def row(ref: str) -> str:
        return "(SELECT " + ", ".join(f"{ref}.{c} AS {c}" for c in READ) + ")"

    changes = {
        "add": ("INSERT", apply("sqlite", row("NEW"))),
        "remove": ("DELETE", apply("sqlite", row("OLD"), "-")),
        "replace": ("UPDATE", [*apply("sqlite", row("OLD"), "-"), *apply("sqlite", row("NEW"))]),
    }
    return [
        f"CREATE TRIGGER ledger_rollup_{name} AFTER {event} ON ledger FOR EACH ROW BEGIN\n"
        + "".join(f"  {s};\n" for s in body)
        + "END"
        for name, (event, body) in changes.items()
    ]


def _cell() -> list[sa.Column[object]]:
    return [
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(200)),
        sa.Column("backend", sa.String(200)),
    ]


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    summed = [sa.Column(n, UNITS if n.startswith("cost_") else sa.BigInteger(), nullable=False)
              for n in SUMS]  # fmt: skip
    op.create_table("ledger_rollup", *_cell(), *summed)
    op.create_table(
        "ledger_rollup_durations",
        *_cell(),
        sa.Column("kind", sa.SmallInteger(), nullable=False),
        sa.Column("ms", sa.Float(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
    )
    for table, cell in (("ledger_rollup", CELL), ("ledger_rollup_durations", DURATION_CELL)):
        op.create_index(f"ux_{table}", table, list(cell), unique=True,
                        postgresql_nulls_not_distinct=True)  # fmt: skip
    for statement in triggers_pg() if dialect == "postgresql" else triggers_sqlite():
        op.execute(statement)
    op.execute(f"INSERT INTO ledger_rollup ({', '.join([*CELL, *SUMS])}) {sums(dialect, 'ledger')}")
    op.execute(
        f"INSERT INTO ledger_rollup_durations ({', '.join([*DURATION_CELL, 'n'])}) "
        f"{durations(dialect, 'ledger')}"
    )


def downgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    for name in ("add", "remove", "replace", *(("clear",) if pg else ())):
        op.execute(f"DROP TRIGGER ledger_rollup_{name}" + (" ON ledger" if pg else ""))
        if pg:
            op.execute(f"DROP FUNCTION ledger_rollup_{name}()")
    for table in TABLES:
        op.drop_table(table)
