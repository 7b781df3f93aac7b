"""Ledger costs as integer units of 1e-10 USD (BIGINT) instead of NUMERIC(20,10) USD.

The writer's COPY encodes integers several times cheaper than NUMERIC, and Postgres adds
them faster in reports. The conversion is exact: every stored amount is a multiple of
1e-10. SQLite already held these columns as integer units (it has no exact decimal type),
so there is nothing to change on it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COSTS = ("cost_input", "cost_cached_input", "cost_cache_write", "cost_output", "cost_total",
         "cost_without_cache")  # fmt: skip
UNITS = 10_000_000_000
"""1e-10 USD units per USD."""


def upgrade() -> None:
    _alter("bigint", f"({{name}} * {UNITS})::bigint")


def downgrade() -> None:
    _alter("numeric(20, 10)", f"({{name}}::numeric / {UNITS})::numeric(20, 10)")


def _alter(type_: str, using: str) -> None:
    """One ALTER TABLE for all six columns: Postgres rewrites the table once, not six times."""
    if op.get_bind().dialect.name != "postgresql":
        return
    clauses = ", ".join(
        f"ALTER COLUMN {name} TYPE {type_} USING {using.format(name=name)}" for name in COSTS
    )
    op.execute(f"ALTER TABLE ledger {clauses}")
