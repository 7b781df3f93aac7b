"""Database statements for teams and keys, and the spend aggregate that seeds budgets.

Only gateway.keys.service (lookups, admin writes) and the `gateway keys` CLI call these;
the request path reaches the database only on a key-cache miss.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
from sqlalchemy import case, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from gateway.flow import Period
from gateway.keys.models import ApiKey, Team
from gateway.keys.secret import display_prefix, hash_secret, new_key_id, new_secret
from gateway.keys.specs import KeySpec, TeamSpec
from gateway.ledger.models import LedgerRow, to_usd


class TeamExists(Exception):
    pass


class UnknownTeam(Exception):
    pass


@dataclass(slots=True, frozen=True)
class TeamInfo:
    name: str
    rpm: int | None
    tpm: int | None
    budget_usd: Decimal | None
    budget_period: Period
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(slots=True, frozen=True)
class KeyInfo:
    """A key as listings show it: everything but the secret and its hash."""

    id: str
    prefix: str
    name: str | None
    team: str
    models: tuple[str, ...] | None
    rpm: int | None
    tpm: int | None
    budget_usd: Decimal | None
    budget_period: Period
    expires_at: datetime | None
    disabled_at: datetime | None
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(slots=True, frozen=True)
class Spend:
    """Ledger spend of one key this month: its team's at the time, and today's share."""

    key_id: str
    team: str | None
    month: Decimal
    today: Decimal


async def create_team(engine: AsyncEngine, spec: TeamSpec, now: datetime) -> TeamInfo:
    team = Team(**spec.model_dump(), created_at=now)
    try:
        async with _session(engine) as session, session.begin():
            session.add(team)
    except IntegrityError as exc:
        raise TeamExists(spec.name) from exc
    return _team(team)


async def list_teams(engine: AsyncEngine) -> list[TeamInfo]:
    async with _session(engine) as session:
        return [_team(t) for t in await session.scalars(select(Team).order_by(Team.name))]


async def create_key(
    engine: AsyncEngine, spec: KeySpec, pepper: str, now: datetime
) -> tuple[KeyInfo, str]:
    """Store a new key; returns it and its secret (which exists nowhere else from here on)."""
    secret = new_secret()
    fields = spec.model_dump(exclude={"models"})
    key = ApiKey(
        **fields,
        id=new_key_id(),
        hash=hash_secret(secret, pepper),
        prefix=display_prefix(secret),
        models=orjson.dumps(spec.models).decode() if spec.models is not None else None,
        created_at=now,
    )
    async with _session(engine) as session, session.begin():
        if await session.get(Team, spec.team) is None:
            raise UnknownTeam(spec.team)
        session.add(key)
    return _key(key), secret


async def list_keys(engine: AsyncEngine, team: str | None = None) -> list[KeyInfo]:
    stmt = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if team is not None:
        stmt = stmt.where(ApiKey.team == team)
    async with _session(engine) as session:
        return [_key(k) for k in await session.scalars(stmt)]


async def disable_key(engine: AsyncEngine, key_id: str, now: datetime) -> KeyInfo | None:
    """Disable the key (a second call keeps the first time); None if there is no such key."""
    async with _session(engine) as session, session.begin():
        key = await session.get(ApiKey, key_id)
        if key is None:
            return None
        if key.disabled_at is None:
            key.disabled_at = now
    return _key(key)


async def find_key(engine: AsyncEngine, key_hash: str) -> tuple[KeyInfo, TeamInfo] | None:
    """The key with this hash and its team, in one query."""
    stmt = select(ApiKey, Team).join(Team, Team.name == ApiKey.team).where(ApiKey.hash == key_hash)
    async with _session(engine) as session:
        row = (await session.execute(stmt)).first()
    return None if row is None else (_key(row[0]), _team(row[1]))


async def month_spend(engine: AsyncEngine, now: datetime) -> list[Spend]:
    """Every key's spend this calendar month (UTC) and today: one aggregate over the ledger."""
    now = now.astimezone(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    today = case((LedgerRow.ts >= day, LedgerRow.cost_total), else_=None)
    stmt = (
        select(
            LedgerRow.key_id,
            LedgerRow.team,
            func.sum(LedgerRow.cost_total).label("month"),
            func.sum(today).label("today"),
        )
        .where(LedgerRow.ts >= month, LedgerRow.key_id.is_not(None))
        .group_by(LedgerRow.key_id, LedgerRow.team)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(stmt)).all()
    return [Spend(r.key_id, r.team, to_usd(r.month or 0), to_usd(r.today or 0)) for r in rows]


def _plain(info: TeamInfo | KeyInfo) -> dict[str, Any]:
    """JSON-ready: money as decimal strings (exact), times as ISO 8601, tuples as lists."""
    out: dict[str, Any] = {}
    for f in fields(info):
        value = getattr(info, f.name)
        if isinstance(value, Decimal):
            value = format(value.normalize(), "f")
        elif isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def _session(engine: AsyncEngine) -> AsyncSession:
    return AsyncSession(engine, expire_on_commit=False)


def _team(t: Team) -> TeamInfo:
    return TeamInfo(
        name=t.name,
        rpm=t.rpm,
        tpm=t.tpm,
        budget_usd=t.budget_usd,
        budget_period=_period(t.budget_period),
        created_at=t.created_at,
    )


def _key(k: ApiKey) -> KeyInfo:
    models = orjson.loads(k.models) if k.models else None
    return KeyInfo(
        id=k.id,
        prefix=k.prefix,
        name=k.name,
        team=k.team,
        models=tuple(models) if models is not None else None,
        rpm=k.rpm,
        tpm=k.tpm,
        budget_usd=k.budget_usd,
        budget_period=_period(k.budget_period),
        expires_at=k.expires_at,
        disabled_at=k.disabled_at,
        created_at=k.created_at,
    )


def _period(value: str) -> Period:
    return "day" if value == "day" else "month"
