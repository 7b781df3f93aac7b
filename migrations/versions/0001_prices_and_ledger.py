"""Prices (versioned by effective_from) and the usage ledger (one row per call).

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Exact money: NUMERIC(20,10) USD; SQLite has no exact decimal, so integer 1e-10 USD units.
MONEY = sa.Numeric(20, 10).with_variant(sa.BigInteger(), "sqlite")
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "prices",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("effective_from", TS, nullable=False),
        sa.Column("input", MONEY, nullable=False),
        sa.Column("cached_input", MONEY, nullable=False),
        sa.Column("cache_write", MONEY, nullable=False),
        sa.Column("output", MONEY, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("model", "effective_from", name="uq_prices_model_from"),
    )
    op.create_table(
        "ledger",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("request_id", sa.String(64), nullable=False, unique=True),
        sa.Column("ts", TS, nullable=False),
        sa.Column("key_id", sa.String(64)),
        sa.Column("team", sa.String(200)),
        sa.Column("model", sa.String(200)),
        sa.Column("backend", sa.String(200)),
        sa.Column("endpoint", sa.String(16), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.Column("error_type", sa.String(64)),
        sa.Column("decision", sa.String(16)),
        sa.Column("served_by", sa.String(16), nullable=False),
        sa.Column("disconnected", sa.Boolean(), nullable=False),
        sa.Column("estimated", sa.Boolean(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_write_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("predicted_cached_tokens", sa.Integer(), nullable=False),
        sa.Column("price_id", ID, sa.ForeignKey("prices.id")),
        sa.Column("cost_input", MONEY, nullable=False),
        sa.Column("cost_cached_input", MONEY, nullable=False),
        sa.Column("cost_cache_write", MONEY, nullable=False),
        sa.Column("cost_output", MONEY, nullable=False),
        sa.Column("cost_total", MONEY, nullable=False),
        sa.Column("cost_without_cache", MONEY, nullable=False),
        sa.Column("ttft_s", sa.Float()),
        sa.Column("latency_s", sa.Float()),
    )
    op.create_index("ix_ledger_ts", "ledger", ["ts"])
    op.create_index("ix_ledger_team_ts", "ledger", ["team", "ts"])
    op.create_index("ix_ledger_key_ts", "ledger", ["key_id", "ts"])
    op.create_index("ix_ledger_model_ts", "ledger", ["model", "ts"])


def downgrade() -> None:
    op.drop_table("ledger")
    op.drop_table("prices")
