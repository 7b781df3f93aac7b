"""Planner statistics for the report groupings (Postgres only).

Without them the planner guesses one group per row for the day expression and gives up
parallel partial aggregation: 2-3x slower over 10 million rows. The expression must stay
the one gateway.ledger.report groups by.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE STATISTICS ledger_report_groups (ndistinct) "
            "ON team, key_id, model, backend, (date(timezone('UTC', ts))) FROM ledger"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP STATISTICS IF EXISTS ledger_report_groups")
