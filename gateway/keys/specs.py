"""What an admin asks for when creating a team or a key: checked once, for the API and CLI.

Money comes as a decimal string ("12.50") or number and stays a Decimal. Team names are
restricted to a safe alphabet because they become part of Redis key names (hash tags).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.flow import Period

TEAM_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: int | None = Field(None, ge=1)
    """Requests per minute; None: unlimited."""
    tpm: int | None = Field(None, ge=1)
    """Tokens (prompt + completion) per minute; None: unlimited."""
    budget_usd: Decimal | None = Field(None, ge=0, max_digits=20, decimal_places=10)
    """Spend allowed per budget_period; None: unlimited."""
    budget_period: Period = "month"


class TeamSpec(Limits):
    name: str = Field(pattern=TEAM_NAME)


class KeySpec(Limits):
    team: str = Field(pattern=TEAM_NAME)
    name: str | None = Field(None, max_length=200)
    """A label for people (e.g. "billing-service prod"); not secret, not unique."""
    models: list[str] | None = Field(None, min_length=1)
    """Models the key may call; None: every model."""
    expires_at: datetime | None = None
    """Naive times are UTC."""

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None or value.tzinfo is not None:
            return value
        return value.replace(tzinfo=UTC)
