"""The key tables, on the ledger's metadata (one schema, one migration history).

A key is stored as its HMAC only; ``prefix`` (the first characters of the secret) is kept
so people can tell their keys apart in listings. Limits left empty mean "no limit".
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.ledger.models import Base, Money, UTCDateTime


class Team(Base):
    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    budget_usd: Mapped[Decimal | None] = mapped_column(Money())
    budget_period: Mapped[str] = mapped_column(String(8))
    """'day' or 'month' (UTC)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ApiKey(Base):
    __tablename__ = "api_keys"
    __table_args__ = (Index("ix_api_keys_team", "team"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Public id (key_...): what the ledger, logs and reports show."""
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    """Hex HMAC-SHA256 of the secret under auth.pepper."""
    prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str | None] = mapped_column(String(200))
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"))
    models: Mapped[str | None] = mapped_column(Text)
    """JSON list of model names the key may call; NULL: every model."""
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    budget_usd: Mapped[Decimal | None] = mapped_column(Money())
    budget_period: Mapped[str] = mapped_column(String(8))
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
