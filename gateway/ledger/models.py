"""The ledger's tables: price versions and one usage row per call.

Money is exact everywhere. The ledger's cost columns hold integer units of 1e-10 USD
(BIGINT on both databases): a call is priced, written and summed in integers, which
asyncpg encodes and Postgres indexes and adds far faster than NUMERIC, and reports turn
the sums into ``Decimal`` USD with :func:`to_usd`. Prices and budgets, written rarely, are
``Numeric(20, 10)`` USD on Postgres; SQLite has no exact decimal type, so there those
columns hold the same integer units, and the :class:`Money` type shows ``Decimal`` on both.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine

SCALE = 10
QUANTUM = Decimal(1).scaleb(-SCALE)
"""Every stored amount is a multiple of this (1e-10 USD)."""


def quantize(value: Decimal) -> Decimal:
    """Round to the ledger's fixed scale (banker's rounding, the Decimal default)."""
    return value.quantize(QUANTUM)


def to_units(usd: Decimal) -> int:
    """USD to integer 1e-10 units (exact for every amount at the ledger's scale)."""
    return int(usd.scaleb(SCALE).to_integral_value())


def to_usd(units: int | Decimal) -> Decimal:
    """Integer 1e-10 units to USD with exactly the ledger's ten decimals.

    A Postgres SUM of BIGINT comes back as an integral Decimal in any exponent (7.5E+6):
    through int it always prints as 0.0007500000.
    """
    return Decimal(int(units)).scaleb(-SCALE)


class Money(TypeDecorator[Decimal]):
    """USD at a fixed scale: NUMERIC on Postgres, integer 1e-10 units on SQLite."""

    impl = Numeric(20, SCALE)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(BigInteger())
        return dialect.type_descriptor(Numeric(20, SCALE))

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        exact = quantize(Decimal(value))
        return int(exact.scaleb(SCALE)) if dialect.name == "sqlite" else exact

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        if value is None:
            return None
        if dialect.name == "sqlite":
            return Decimal(int(value)).scaleb(-SCALE)
        return quantize(Decimal(value))


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC timestamp: timestamptz on Postgres, naive UTC text on SQLite."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        utc = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class Price(Base):
    """A model's price from ``effective_from`` on; a change adds a row, never edits one."""

    __tablename__ = "prices"
    __table_args__ = (UniqueConstraint("model", "effective_from", name="uq_prices_model_from"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    model: Mapped[str] = mapped_column(String(200))
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime())
    input: Mapped[Decimal] = mapped_column(Money())
    """USD per million standard input tokens; the other three likewise."""
    cached_input: Mapped[Decimal] = mapped_column(Money())
    cache_write: Mapped[Decimal] = mapped_column(Money())
    output: Mapped[Decimal] = mapped_column(Money())
    source: Mapped[str] = mapped_column(String(16))
    """'config' (synced at start) or 'admin' (POST /admin/prices)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class LedgerRow(Base):
    """One finished call, written once: request_id is unique so a retried write is a no-op."""

    __tablename__ = "ledger"
    __table_args__ = (
        Index("ix_ledger_ts", "ts"),
        Index("ix_ledger_team_ts", "team", "ts"),
        Index("ix_ledger_key_ts", "key_id", "ts"),
        Index("ix_ledger_model_ts", "model", "ts"),
        # Partial: most calls carry no client id, and their rows then cost no index entry.
        Index(
            "ix_ledger_client_request_id",
            "client_request_id",
            postgresql_where=text("client_request_id IS NOT NULL"),
            sqlite_where=text("client_request_id IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    """The gateway's own id for the call (never the client's): one row per call."""
    ts: Mapped[datetime] = mapped_column(UTCDateTime())
    """When the gateway received the call (the price in force then is the one used)."""
    key_id: Mapped[str | None] = mapped_column(String(64))
    team: Mapped[str | None] = mapped_column(String(200))
    model: Mapped[str | None] = mapped_column(String(200))
    backend: Mapped[str | None] = mapped_column(String(200))
    endpoint: Mapped[str] = mapped_column(String(16))
    stream: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[int] = mapped_column(SmallInteger)
    error_type: Mapped[str | None] = mapped_column(String(64))
    decision: Mapped[str | None] = mapped_column(String(16))
    """The routing outcome (hit, miss, overflow, ...), None if the call never got routed."""
    served_by: Mapped[str] = mapped_column(String(16))
    """upstream, or coalesced / batched / held when a batching mechanism served it."""
    disconnected: Mapped[bool] = mapped_column(Boolean)
    estimated: Mapped[bool] = mapped_column(Boolean)
    """Token counts were counted by the gateway, not reported by the backend."""
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(Integer)
    """Standard input: prompt - cached - cache_write (OpenAI's prompt includes the cached)."""
    cached_tokens: Mapped[int] = mapped_column(Integer)
    cache_write_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    predicted_cached_tokens: Mapped[int] = mapped_column(Integer)
    price_id: Mapped[int | None] = mapped_column(ForeignKey("prices.id"))
    cost_input: Mapped[int] = mapped_column(BigInteger)
    """Integer units of 1e-10 USD, like every cost_* column (to_usd gives USD)."""
    cost_cached_input: Mapped[int] = mapped_column(BigInteger)
    cost_cache_write: Mapped[int] = mapped_column(BigInteger)
    cost_output: Mapped[int] = mapped_column(BigInteger)
    cost_total: Mapped[int] = mapped_column(BigInteger)
    cost_without_cache: Mapped[int] = mapped_column(BigInteger)
    """What the call would have cost had every prompt token been standard input."""
    ttft_s: Mapped[float | None] = mapped_column(Float)
    latency_s: Mapped[float | None] = mapped_column(Float)
    client_request_id: Mapped[str | None] = mapped_column(String(128))
    """The x-request-id header the client sent, if any (not unique: clients reuse them)."""
    end_user: Mapped[str | None] = mapped_column(String(32))
    """The app's end user (`safety_identifier`, else `user`), as its HMAC under the
    pepper (keys/secret.py): groups an end user's calls without storing who it is."""


class DeadLetter(Base):
    """A ledger row the database refused for what it holds, set aside for an operator.

    The row is kept as ASCII-only JSON text (every other character escaped), so even a
    row carrying a NUL or an over-long string, which no column could take, is stored.
    ``digest`` (sha256 of that text) makes setting the same row aside twice a no-op.
    """

    __tablename__ = "ledger_dead_letters"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    request_id: Mapped[str] = mapped_column(String(64))
    """The row's request_id, escaped and cut like the row text: for finding it."""
    set_aside_at: Mapped[datetime] = mapped_column(UTCDateTime())
    error: Mapped[str] = mapped_column(Text)
    """Why the database refused it (SQLSTATE and message, escaped)."""
    row: Mapped[str] = mapped_column(Text)


ROW_COLUMNS: tuple[str, ...] = tuple(c.name for c in LedgerRow.__table__.columns if c.name != "id")
"""The columns a writer fills, in table order (id is assigned by the database)."""


TOKEN_COLUMNS = ("prompt_tokens", "input_tokens", "cached_tokens", "cache_write_tokens",
                 "completion_tokens")  # fmt: skip
COST_COLUMNS = ("cost_input", "cost_cached_input", "cost_cache_write", "cost_output",
                "cost_total", "cost_without_cache")  # fmt: skip
ROLLUP_SUMS = ("requests", "refused", "failed", *TOKEN_COLUMNS, *COST_COLUMNS)
"""What the hourly rollup adds up per cell: served, refused and failed calls, then the
ledger columns of the same names (costs in 1e-10 USD units), as a report does."""
_UNITS = BigInteger().with_variant(Numeric(38, 0), "postgresql")
"""Summed units: NUMERIC on Postgres, where BIGINT would overflow at ~922M USD a cell."""


def _cell(*columns: Column[Any]) -> list[Column[Any]]:
    """The rollup's key: the UTC hour and the groupings it answers, then its own."""
    return [
        Column("hour", UTCDateTime(), nullable=False),
        Column("model", String(200)),
        Column("backend", String(200)),
        *columns,
    ]


def _unique(table: str, *columns: str) -> Index:
    # NULL is a value here (a call never routed has no backend): one cell holds them all.
    return Index(f"ux_{table}", *columns, unique=True, postgresql_nulls_not_distinct=True)


ROLLUP = Table(
    "ledger_rollup",
    Base.metadata,
    *_cell(
        *(
            Column(n, _UNITS if n in COST_COLUMNS else BigInteger(), nullable=False)
            for n in ROLLUP_SUMS
        )
    ),
    _unique("ledger_rollup", "hour", "model", "backend"),
)
"""The ledger added up per UTC hour, model and backend, kept by triggers on the ledger in
the transaction that changes its rows (migrations 0007, 0008): reports read whole hours here."""

ROLLUP_DURATIONS = Table(
    "ledger_rollup_durations",
    Base.metadata,
    *_cell(
        Column("kind", SmallInteger(), nullable=False),
        Column("ms", Float(), nullable=False),
        Column("n", BigInteger(), nullable=False),
    ),
    _unique("ledger_rollup_durations", "hour", "model", "backend", "kind", "ms"),
)
"""Per cell, how many served calls took each counted duration (gateway.ledger.scorecard):
kind 0 is time to first token, 1 end to end. The counts rank exactly as the rows would."""
