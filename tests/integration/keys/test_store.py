"""Teams, keys and lookups against real Postgres and SQLite."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.errors import Unauthorized
from gateway.flow import ANONYMOUS, Cost
from gateway.keys import KeyRing, store
from gateway.keys.specs import KeySpec, TeamSpec
from gateway.ledger.models import to_units
from gateway.ledger.rows import ledger_row
from gateway.ledger.store import insert_rows
from gateway.settings import AuthSettings
from tests.clock import Clock, key_renewals
from tests.integration.ledger.factory import make_call

NOW = datetime.now(UTC)


def ring(engine: AsyncEngine, ttl: float = 5.0, clock: Clock | None = None) -> KeyRing:
    settings = AuthSettings(pepper="test-pepper", cache_ttl=ttl)
    return KeyRing(settings, engine, CollectorRegistry(), enabled=True, clock=clock or Clock())


async def test_teams_are_unique(engine: AsyncEngine) -> None:
    await store.create_team(engine, TeamSpec(name="eng", rpm=5), NOW)
    with pytest.raises(store.TeamExists):
        await store.create_team(engine, TeamSpec(name="eng"), NOW)
    [team] = await store.list_teams(engine)
    assert (team.name, team.rpm, team.tpm, team.budget_period) == ("eng", 5, None, "month")


async def test_a_key_needs_an_existing_team(engine: AsyncEngine) -> None:
    with pytest.raises(store.UnknownTeam):
        await store.create_key(engine, KeySpec(team="ghost"), "p", NOW)


async def test_only_the_hash_is_stored(engine: AsyncEngine) -> None:
    await store.create_team(engine, TeamSpec(name="eng"), NOW)
    key, secret = await store.create_key(engine, KeySpec(team="eng"), "p", NOW)
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT * FROM api_keys"))).one()._asdict()
    assert secret not in str(stored)
    assert stored["prefix"] == secret[:11]
    assert "key" not in key.as_dict()


async def test_a_key_authenticates_as_its_principal(engine: AsyncEngine) -> None:
    keys = ring(engine)
    await keys.create_team(TeamSpec(name="eng", rpm=100, tpm=10_000,
                                    budget_usd=Decimal("20"), budget_period="day"))  # fmt: skip
    spec = KeySpec(team="eng", models=["a", "b"], rpm=10, budget_usd=Decimal("1.25"))
    key, secret = await keys.create_key(spec)
    p = await keys.authenticate(f"Bearer {secret}")
    assert p.key_id == key.id
    assert p.team == "eng"
    assert p.models == frozenset({"a", "b"})
    assert (p.rpm, p.tpm, p.budget_usd, p.budget_period) == (10, None, Decimal("1.25"), "month")
    assert (p.team_rpm, p.team_tpm, p.team_budget_usd, p.team_budget_period) == (
        100, 10_000, Decimal("20"), "day")  # fmt: skip


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "You didn't provide an API key"),
        ("Basic abc", "You didn't provide an API key"),
        ("Bearer sk-not-ours-at-all-0123456789", "Incorrect API key"),
        ("Bearer gk-" + "x" * 43, "Incorrect API key"),
    ],
)
async def test_missing_and_wrong_keys_are_401(
    engine: AsyncEngine, header: str | None, message: str
) -> None:
    with pytest.raises(Unauthorized) as info:
        await ring(engine).authenticate(header)
    assert info.value.status == 401
    assert info.value.code == "invalid_api_key"
    assert info.value.message.startswith(message)


async def test_a_disabled_key_stops_here_at_once_and_elsewhere_within_the_ttl(
    engine: AsyncEngine,
) -> None:
    clock = Clock()
    here, there = ring(engine), ring(engine, ttl=0.3, clock=clock)
    await here.create_team(TeamSpec(name="eng"))
    key, secret = await here.create_key(KeySpec(team="eng"))
    for keys in (here, there):
        await keys.authenticate(f"Bearer {secret}")
    assert (await here.disable_key(key.id)) is not None
    with pytest.raises(Unauthorized, match="disabled"):
        await here.authenticate(f"Bearer {secret}")
    await there.authenticate(f"Bearer {secret}")  # still cached on the other replica
    clock.now += 0.3
    with pytest.raises(Unauthorized, match="disabled"):
        await there.authenticate(f"Bearer {secret}")
    assert (await here.disable_key("key_nonexistent")) is None


async def test_a_key_in_use_is_renewed_in_the_background_within_the_ttl(
    engine: AsyncEngine,
) -> None:
    """Near the end of the answer's life a call is answered from it at once while the
    lookup runs again behind it; the renewed answer (here: disabled) lands before the old
    one would have expired."""
    ttl, clock = 2.0, Clock()
    here, there = ring(engine), ring(engine, ttl=ttl, clock=clock)
    await here.create_team(TeamSpec(name="eng"))
    key, secret = await here.create_key(KeySpec(team="eng"))
    header = f"Bearer {secret}"
    await there.authenticate(header)
    await here.disable_key(key.id)
    clock.now += 0.85 * ttl  # past 80% of the ttl, before its end
    assert there.known(header) is None  # due: the pipeline goes on to authenticate...
    principal = await there.authenticate(header)
    assert principal.key_id == key.id  # ...which answers from the old entry, not the disabled
    await key_renewals()
    with pytest.raises(Unauthorized, match="disabled"):  # landed, the clock short of the ttl
        there.known(header)
    await there.aclose()


async def test_known_answers_from_the_cache_alone(engine: AsyncEngine) -> None:
    """The pipeline's no-await path: None whenever a lookup (or a refusal only the lookup
    can give) is needed, the principal or the refusal once the cache holds the answer."""
    keys, other = ring(engine), ring(engine)
    await keys.create_team(TeamSpec(name="eng"))
    key, secret = await keys.create_key(KeySpec(team="eng"))
    header = f"Bearer {secret}"
    assert keys.known(header) is None  # not looked up yet
    assert keys.known(None) is None  # authenticate() refuses it
    assert keys.known("Bearer gk-wrong") is None
    assert (await keys.authenticate(header)).key_id == key.id
    known = keys.known(header)
    assert known is not None
    assert known.key_id == key.id
    with pytest.raises(Unauthorized):
        await keys.authenticate("Bearer gk-not-a-key-but-long-enough")
    with pytest.raises(Unauthorized, match="Incorrect"):  # a cached not-found is a refusal
        keys.known("Bearer gk-not-a-key-but-long-enough")
    await other.authenticate(header)
    await keys.disable_key(key.id)
    with pytest.raises(Unauthorized, match="disabled"):
        await keys.authenticate(header)
    with pytest.raises(Unauthorized, match="disabled"):  # now cached as disabled
        keys.known(header)
    assert other.known(header) is not None  # the other replica's entry is still fresh
    anonymous = KeyRing(AuthSettings(), engine, CollectorRegistry(), enabled=False)
    assert anonymous.known(None) is ANONYMOUS


async def test_an_expired_key_is_refused_even_from_the_cache(engine: AsyncEngine) -> None:
    keys = ring(engine)
    await keys.create_team(TeamSpec(name="eng"))
    soon = datetime.now(UTC) + timedelta(seconds=3)  # a loaded machine may take seconds
    _, secret = await keys.create_key(KeySpec(team="eng", expires_at=soon))
    await keys.authenticate(f"Bearer {secret}")  # now in the cache
    await asyncio.sleep((soon - datetime.now(UTC)).total_seconds() + 0.05)
    with pytest.raises(Unauthorized, match="expired"):
        await keys.authenticate(f"Bearer {secret}")


async def test_a_changed_pepper_invalidates_keys(engine: AsyncEngine) -> None:
    await ring(engine).create_team(TeamSpec(name="eng"))
    _, secret = await ring(engine).create_key(KeySpec(team="eng"))
    other = KeyRing(AuthSettings(pepper="other"), engine, CollectorRegistry(), enabled=True)
    with pytest.raises(Unauthorized):
        await other.authenticate(f"Bearer {secret}")


async def test_month_spend_is_one_aggregate_of_this_month_and_today(engine: AsyncEngine) -> None:
    now = datetime.now(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    rows = []
    for key, team, when, usd in [
        ("key_a", "eng", now, "0.0000000003"),
        ("key_a", "eng", day + timedelta(seconds=1), "1.5"),
        ("key_a", "eng", month + timedelta(seconds=1), "2"),  # may be today on the 1st
        ("key_a", "eng", month - timedelta(seconds=1), "100"),  # last month: not counted
        ("key_b", "ops", now, "0.25"),
        (None, None, now, "7"),  # anonymous: no key to budget
    ]:
        call = make_call(key=key, team=team, received_wall=when.timestamp())
        rows.append(ledger_row(call, Cost(total=to_units(Decimal(usd)))))
    await insert_rows(engine, rows)
    got = {s.key_id: s for s in await store.month_spend(engine, now)}
    assert set(got) == {"key_a", "key_b"}
    a = got["key_a"]
    assert a.month == Decimal("3.5000000003")
    first_day = day == month
    assert a.today == (Decimal("3.5000000003") if first_day else Decimal("1.5000000003"))
    assert (got["key_b"].team, got["key_b"].month, got["key_b"].today) == (
        "ops", Decimal("0.25"), Decimal("0.25"))  # fmt: skip


async def test_a_reload_keeps_the_principal_of_an_unchanged_key(engine: AsyncEngine) -> None:
    """Principals compare by identity, and the limits stage keeps a plan per principal:
    a new object at every reload would make plans pile up to their bound."""
    ttl, clock = 0.2, Clock()
    keys = ring(engine, ttl=ttl, clock=clock)
    await keys.create_team(TeamSpec(name="eng", rpm=100))
    key, secret = await keys.create_key(KeySpec(team="eng", rpm=10, budget_usd=Decimal("2")))
    header = f"Bearer {secret}"
    first = await keys.authenticate(header)
    clock.now += ttl
    assert keys.known(header) is None  # expired: the next call loads the key again
    assert await keys.authenticate(header) is first
    async with engine.begin() as conn:
        await conn.exec_driver_sql(f"UPDATE api_keys SET rpm = 11 WHERE id = '{key.id}'")
    clock.now += ttl
    changed = await keys.authenticate(header)
    assert changed is not first
    assert changed.rpm == 11
    await keys.aclose()
