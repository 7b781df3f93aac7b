"""Teams and API keys (hashed), with their rate limits and budgets.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As in 0001: NUMERIC(20,10) USD; integer 1e-10 USD units on SQLite.
MONEY = sa.Numeric(20, 10).with_variant(sa.BigInteger(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("rpm", sa.Integer()),
        sa.Column("tpm", sa.Integer()),
        sa.Column("budget_usd", MONEY),
        sa.Column("budget_period", sa.String(8), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200)),
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name"), nullable=False),
        sa.Column("models", sa.Text()),
        sa.Column("rpm", sa.Integer()),
        sa.Column("tpm", sa.Integer()),
        sa.Column("budget_usd", MONEY),
        sa.Column("budget_period", sa.String(8), nullable=False),
        sa.Column("expires_at", TS),
        sa.Column("disabled_at", TS),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_api_keys_team", "api_keys", ["team"])


def downgrade() -> None:
    op.drop_table("api_keys")
    op.drop_table("teams")
