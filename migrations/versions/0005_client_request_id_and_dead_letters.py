"""The client's x-request-id beside the gateway's own id, and the dead-letter table.

The ledger's request_id is the gateway's id for the call from this version on; the id a
client sends is kept in client_request_id (indexed, for finding a client's calls).
Ledger rows the database refuses for their content are set aside in ledger_dead_letters.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("ledger", sa.Column("client_request_id", sa.String(128)))
    present = sa.text("client_request_id IS NOT NULL")  # rows without one cost no entry
    op.create_index(
        "ix_ledger_client_request_id",
        "ledger",
        ["client_request_id"],
        postgresql_where=present,
        sqlite_where=present,
    )
    op.create_table(
        "ledger_dead_letters",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("set_aside_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("row", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ledger_dead_letters")
    op.drop_index("ix_ledger_client_request_id", "ledger")
    with op.batch_alter_table("ledger") as batch:
        batch.drop_column("client_request_id")
