"""The app's end user on each ledger row, hashed (`safety_identifier`, else `user`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("ledger", sa.Column("end_user", sa.String(32)))


def downgrade() -> None:
    op.drop_column("ledger", "end_user")
