"""Admin routes: cost reports, calls by client request id, prices, teams and API keys.

Every route needs ``Authorization: Bearer <auth.admin_key>``: a missing key answers 401,
a wrong one 403. With no admin key configured the admin API is disabled (403 for all):
a "loopback only" rule would let anyone in behind a reverse proxy on the same host, and
`gateway report` reads the ledger directly where no key is set. Every route works on the
database: while it cannot be reached, each answers 503 (StoreUnavailable), never 500.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.openai import ServicesDep
from gateway.errors import Forbidden, InvalidRequest, NotFound, StoreUnavailable, Unauthorized
from gateway.keys import KeyRing
from gateway.keys.specs import KeySpec, TeamSpec
from gateway.keys.store import TeamExists, UnknownTeam
from gateway.ledger import Ledger
from gateway.ledger.db import DB_ERRORS
from gateway.ledger.prices import PriceVersion
from gateway.ledger.report import parse_group_by, parse_when
from gateway.settings import AuthSettings, Settings


def admin_guard(auth: AuthSettings) -> Callable[[str | None], None]:
    def guard(authorization: Annotated[str | None, Header()] = None) -> None:
        if auth.admin_key is None:
            raise Forbidden("the admin API is disabled: configure auth.admin_key")
        if authorization is None:
            raise Unauthorized("admin key missing: send Authorization: Bearer <admin key>")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), auth.admin_key.encode()
        ):
            raise Forbidden("wrong admin key")

    return guard


class PriceIn(BaseModel):
    """USD per million tokens; send amounts as strings ("0.15") to keep them exact."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=200)
    input: Decimal = Field(ge=0)
    cached_input: Decimal = Field(ge=0)
    cache_write: Decimal = Field(Decimal(0), ge=0)
    output: Decimal = Field(ge=0)
    effective_from: datetime | None = None
    """Default (and earliest allowed): now. A future time schedules the change."""


async def _ledger(svc: ServicesDep) -> Ledger:
    return svc.ledger


LedgerDep = Annotated[Ledger, Depends(_ledger)]


async def _keys(svc: ServicesDep) -> KeyRing:
    return svc.keys


KeysDep = Annotated[KeyRing, Depends(_keys)]


class DatabaseRoute(APIRoute):
    """A route whose handler works on the database: the seam where its connection errors
    become StoreUnavailable (503), for every admin route at once."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def mapped(request: Request) -> Response:
            try:
                return await handler(request)
            except DB_ERRORS as exc:
                raise StoreUnavailable("The database is unavailable; try again shortly.") from exc

        return mapped


def admin_router(settings: Settings) -> APIRouter:
    router = APIRouter(
        prefix="/admin",
        dependencies=[Depends(admin_guard(settings.auth))],
        route_class=DatabaseRoute,
    )
    add_ledger_routes(router)
    add_key_routes(router)
    return router


def add_ledger_routes(router: APIRouter) -> None:
    """Cost reports, call lookup and the price book."""

    @router.get("/reports/costs")
    async def cost_report(
        ledger: LedgerDep,
        start: Annotated[str | None, Query(alias="from")] = None,
        end: Annotated[str | None, Query(alias="to")] = None,
        group_by: str = "team",
        format: Literal["json", "csv"] = "json",
    ) -> Response:
        try:
            groups = parse_group_by(group_by)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="group_by") from exc
        report = await ledger.report(_when(start, "from"), _when(end, "to"), groups)
        if format == "csv":
            return Response(report.to_csv(), media_type="text/csv; charset=utf-8")
        return _json(report.to_json())

    @router.get("/calls")
    async def find_calls(
        ledger: LedgerDep, client_request_id: Annotated[str, Query(min_length=1, max_length=128)]
    ) -> Response:
        """The calls a client sent with this x-request-id, oldest first."""
        return _json({"data": await ledger.calls_by_client_id(client_request_id)})

    @router.get("/prices")
    async def list_prices(ledger: LedgerDep, model: str | None = None) -> Response:
        return _json({"data": [_price(v) for v in ledger.price_history(model)]})

    @router.post("/prices", status_code=201)
    async def add_price(body: PriceIn, ledger: LedgerDep) -> Response:
        prices = (body.input, body.cached_input, body.cache_write, body.output)
        version = await ledger.set_price(body.model, prices, body.effective_from)
        return _json(_price(version), status=201)


def add_key_routes(router: APIRouter) -> None:
    """Teams and keys."""

    @router.post("/teams", status_code=201)
    async def create_team(body: TeamSpec, keys: KeysDep) -> Response:
        try:
            team = await keys.create_team(body)
        except TeamExists:
            raise InvalidRequest(f"team {body.name!r} already exists", param="name") from None
        return _json(team.as_dict(), status=201)

    @router.get("/teams")
    async def list_teams(keys: KeysDep) -> Response:
        return _json({"data": [t.as_dict() for t in await keys.teams()]})

    @router.post("/keys", status_code=201)
    async def create_key(body: KeySpec, keys: KeysDep) -> Response:
        """The answer's ``key`` is the secret: shown here once, stored nowhere."""
        try:
            key, secret = await keys.create_key(body)
        except UnknownTeam:
            raise NotFound(f"no team {body.team!r}: create it first", param="team") from None
        return _json({**key.as_dict(), "key": secret}, status=201)

    @router.get("/keys")
    async def list_keys(keys: KeysDep, team: str | None = None) -> Response:
        return _json({"data": [k.as_dict() for k in await keys.keys(team)]})

    @router.post("/keys/{key_id}/disable")
    async def disable_key(key_id: str, keys: KeysDep) -> Response:
        key = await keys.disable_key(key_id)
        if key is None:
            raise NotFound(f"no key {key_id!r}", param="key_id")
        return _json(key.as_dict())


def _when(text: str | None, param: str) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_when(text)
    except ValueError as exc:
        raise InvalidRequest(f"{param}: not an ISO date or time: {text!r}", param=param) from exc


def _price(v: PriceVersion) -> dict[str, Any]:
    return {
        "id": v.id,
        "model": v.model,
        "effective_from": v.effective_from.isoformat(),
        "input": format(v.input, "f"),
        "cached_input": format(v.cached_input, "f"),
        "cache_write": format(v.cache_write, "f"),
        "output": format(v.output, "f"),
        "source": v.source,
    }


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")
