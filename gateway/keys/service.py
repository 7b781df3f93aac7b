"""KeyRing: turns a bearer token into a Principal, and issues and revokes keys.

Lookups go through a LookupCache indexed by the whole Authorization header (secret.py says
why not by a hash of it), so a cached call (``known``) costs one dict lookup, and awaits
and parses nothing; the HMAC that finds the key in the database is computed only on a
miss, or by the renewal the cache starts in the background near the end of an answer's
life (then one call goes through ``authenticate``, and no call waits). A disabled key
stops working on every replica within auth.cache_ttl, and on the replica that disabled it
at once. Expiry is checked on every call, so an expiring key ends on time even when cached.
While the database fails, a key it confirmed within auth.stale_for works from that record
and any other gets 503 (never 401: nobody could check it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.errors import StoreUnavailable, Unauthorized
from gateway.flow import ANONYMOUS, Principal
from gateway.keys import store
from gateway.keys.cache import LookupCache
from gateway.keys.secret import hash_secret, looks_like_key
from gateway.keys.specs import KeySpec, TeamSpec
from gateway.keys.store import KeyInfo, TeamInfo
from gateway.ledger.db import DB_ERRORS
from gateway.settings import AuthSettings

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "::1", "localhost")

MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


@dataclass(slots=True, frozen=True)
class Grant:
    """A cached lookup: the principal, and what decides whether it may still call."""

    principal: Principal
    expires_at: float | None
    """Epoch seconds (compared with time.time(): cheaper than an aware datetime)."""
    disabled: bool


class KeyRing:
    def __init__(
        self,
        settings: AuthSettings,
        engine: AsyncEngine,
        registry: CollectorRegistry,
        *,
        enabled: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self._settings = settings
        self._engine = engine
        self._cache: LookupCache[Grant] = LookupCache(
            settings.cache_ttl,
            settings.cache_size,
            stale_on=DB_ERRORS,
            stale_for=settings.stale_for,
            clock=clock,
        )
        self._failures = Counter(
            "gateway_auth_failures",
            "Calls refused by authentication, by reason (missing, invalid, disabled, expired).",
            ["reason"],
            registry=registry,
        )
        self._stale_keys = Gauge(
            "gateway_auth_stale_keys",
            "Keys served from their last known record while the key store fails (auth.stale_for).",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self._stale_age = Gauge(
            "gateway_auth_stale_seconds",
            "Age of the oldest key record served that way (they stop at auth.stale_for).",
            registry=registry,
            multiprocess_mode="livemax",
        )

    def announce(self, host: str) -> None:
        """Say in the log whether calls need a key (and warn about an open, exposed gateway)."""
        if self.enabled:
            if not self._settings.pepper:
                log.warning("auth: auth.pepper is empty; set one so stolen key hashes are useless")
            log.info("auth: on; every call needs an API key (Authorization: Bearer gk-...)")
        elif host in LOOPBACK:
            log.warning("auth: off; every caller is anonymous (open on loopback %s)", host)
        else:
            log.warning("auth: OFF on %s, reachable beyond this host: anyone may call", host)

    async def aclose(self) -> None:
        await self._cache.aclose()

    def stale(self) -> tuple[int, float]:
        """Keys in use served from records the store failed to confirm, and the oldest
        record's age in seconds; also sets the gauges (read at each scrape)."""
        keys, age = self._cache.stale()
        self._stale_keys.set(keys)
        self._stale_age.set(age)
        return keys, age

    async def month_spend(self) -> list[store.Spend]:
        """This month's (and today's) spend per key, from the ledger: seeds the budgets."""
        return await store.month_spend(self._engine, datetime.now(UTC))

    def known(self, authorization: str | None) -> Principal | None:
        """The caller's principal when the key cache knows its header (no await, no parse:
        nearly every call); raises Unauthorized when it knows the key is refused; None when
        only ``authenticate`` can tell."""
        if not self.enabled:
            return ANONYMOUS
        if authorization is None:
            return None
        hit = self._cache.fresh(authorization)
        return self._admit(hit.value) if hit is not None else None

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller's principal, or Unauthorized (401 invalid_api_key)."""
        principal = self.known(authorization)
        if principal is not None:
            return principal
        token = _bearer(authorization)
        if token is None:
            raise self._refuse("missing", MISSING)
        if not looks_like_key(token):
            raise self._refuse("invalid", "Incorrect API key provided.")
        assert authorization is not None
        return self._admit(await self._lookup(token, authorization))

    async def create_team(self, spec: TeamSpec) -> TeamInfo:
        return await store.create_team(self._engine, spec, datetime.now(UTC))

    async def teams(self) -> list[TeamInfo]:
        return await store.list_teams(self._engine)

    async def create_key(self, spec: KeySpec) -> tuple[KeyInfo, str]:
        """A new key and its secret: the only time the secret is ever available."""
        return await store.create_key(self._engine, spec, self._settings.pepper, datetime.now(UTC))

    async def keys(self, team: str | None = None) -> list[KeyInfo]:
        return await store.list_keys(self._engine, team)

    async def disable_key(self, key_id: str) -> KeyInfo | None:
        key = await store.disable_key(self._engine, key_id, datetime.now(UTC))
        self._cache.clear()
        return key

    async def _lookup(self, token: str, header: str) -> Grant | None:
        """A cache miss: find the key by its stored hash (one query per header and ttl)."""
        try:
            return await self._cache.get(header, lambda: self._find(token, header))
        except DB_ERRORS as exc:
            raise StoreUnavailable("The key store is unavailable; try again shortly.") from exc

    async def _find(self, token: str, header: str) -> Grant | None:
        found = await store.find_key(self._engine, hash_secret(token, self._settings.pepper))
        if found is None:
            return None
        key, team = found
        expires = key.expires_at.timestamp() if key.expires_at is not None else None
        return Grant(self._same(header, principal(key, team)), expires, key.disabled_at is not None)

    def _same(self, header: str, new: Principal) -> Principal:
        """The principal this header had before when nothing in it changed.

        Principals compare by identity (the limits stage keeps a plan per principal, the
        Redis limiter a shape per plan), so handing out a new object at every reload would
        build both again every ``cache_ttl`` for every key in use, and keep the old ones
        until their bounds are reached.
        """
        old = self._cache.peek(header)
        if old is not None and astuple(old.principal) == astuple(new):
            return old.principal
        return new

    def _admit(self, grant: Grant | None) -> Principal:
        if grant is None:
            raise self._refuse("invalid", "Incorrect API key provided.")
        if grant.disabled:
            raise self._refuse("disabled", "This API key has been disabled.")
        if grant.expires_at is not None and grant.expires_at <= time.time():
            raise self._refuse("expired", "This API key has expired.")
        return grant.principal

    def _refuse(self, reason: str, message: str) -> Unauthorized:
        self._failures.labels(reason).inc()
        return Unauthorized(message)


def principal(key: KeyInfo, team: TeamInfo) -> Principal:
    return Principal(
        key_id=key.id,
        team=team.name,
        models=frozenset(key.models) if key.models is not None else None,
        rpm=key.rpm,
        tpm=key.tpm,
        budget_usd=key.budget_usd,
        budget_period=key.budget_period,
        team_rpm=team.rpm,
        team_tpm=team.tpm,
        team_budget_usd=team.budget_usd,
        team_budget_period=team.budget_period,
    )


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
