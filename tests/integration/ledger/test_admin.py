"""The admin report and price routes, behind the admin key, against a real Postgres."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry

from gateway.api.admin import admin_router
from gateway.api.openai import error_response
from gateway.errors import GatewayError
from gateway.flow import Usage
from gateway.ledger import Ledger
from gateway.settings import Settings
from tests.integration.ledger.factory import ledger_settings, make_call, record

ADMIN = {"Authorization": "Bearer sk-admin-test"}
PRICES = {"alpha": {"input": "0.15", "cached_input": "0.075", "output": "0.60"}}


@dataclass
class LedgerServices:
    """The one part of gateway.services.Services the admin routes use."""

    ledger: Ledger


def app_for(settings: Settings, ledger: Ledger) -> FastAPI:
    app = FastAPI()

    async def gateway_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc)

    app.add_exception_handler(GatewayError, gateway_error)
    app.include_router(admin_router(settings))
    app.state.services = LedgerServices(ledger)
    return app


@pytest.fixture
async def admin(
    pg_db_url: str, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, Ledger, CollectorRegistry]]:
    settings = ledger_settings(pg_db_url, tmp_path / "spool", PRICES)
    settings = settings.model_copy(
        update={"auth": settings.auth.model_copy(update={"admin_key": "sk-admin-test"})}
    )
    registry = CollectorRegistry()
    ledger = Ledger(settings, registry)
    await ledger.start()
    transport = httpx.ASGITransport(app=app_for(settings, ledger))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client, ledger, registry
    await ledger.aclose()


async def written(registry: CollectorRegistry, n: int) -> None:
    for _ in range(200):
        if registry.get_sample_value("gateway_ledger_rows_written_total") == n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{n} rows not written")


async def test_admin_key_is_required(
    admin: tuple[httpx.AsyncClient, Ledger, CollectorRegistry],
) -> None:
    client, _, _ = admin
    missing = await client.get("/admin/prices")
    wrong = await client.get("/admin/prices", headers={"Authorization": "Bearer nope"})
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "invalid_api_key")
    assert wrong.status_code == 403
    assert wrong.json() == {"error": {"message": "wrong admin key", "type": "permission_error",
                                      "param": None, "code": "permission_denied"}}  # fmt: skip


async def test_admin_api_disabled_without_a_key(pg_db_url: str, tmp_path: Path) -> None:
    settings = ledger_settings(pg_db_url, tmp_path / "spool", PRICES)
    ledger = Ledger(settings, CollectorRegistry())
    transport = httpx.ASGITransport(app=app_for(settings, ledger))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        resp = await client.get("/admin/reports/costs", headers=ADMIN)
    assert resp.status_code == 403
    assert "disabled" in resp.json()["error"]["message"]


async def test_post_price_then_report(
    admin: tuple[httpx.AsyncClient, Ledger, CollectorRegistry],
) -> None:
    client, ledger, registry = admin
    record(ledger, make_call("alpha", usage=Usage(1000, 0, 1000)))
    body = {"model": "alpha", "input": "0.30", "cached_input": "0.03", "output": "1.2"}
    posted = await client.post("/admin/prices", json=body, headers=ADMIN)
    assert posted.status_code == 201
    assert posted.json()["input"] == "0.3000000000"
    record(ledger, make_call("alpha", team="team-b", usage=Usage(1000, 0, 1000)))
    await written(registry, 2)

    listed = (await client.get("/admin/prices", params={"model": "alpha"}, headers=ADMIN)).json()
    assert [(p["source"], p["output"]) for p in listed["data"]] == [
        ("config", "0.6000000000"), ("admin", "1.2000000000")
    ]  # fmt: skip
    report = await client.get("/admin/reports/costs", params={"group_by": "team"}, headers=ADMIN)
    assert report.status_code == 200
    lines = [(r["team"], r["requests"], r["cost_total"]) for r in report.json()["rows"]]
    assert lines == [("team-a", 1, "0.0007500000"), ("team-b", 1, "0.0015000000")]
    assert report.json()["totals"]["cost_total"] == "0.0022500000"
    # The scorecard: team-a paid 0.00015 for 1000 prompt tokens, team-b 0.0003 (the new
    # price); neither streamed, each took 0.505 s (counted 500 ms).
    scores = [(r["usd_per_m_prompt"], r["ttft_p50_ms"], r["e2e_p50_ms"], r["failed"])
              for r in report.json()["rows"]]  # fmt: skip
    assert scores == [("0.1500000000", None, 500, 0), ("0.3000000000", None, 500, 0)]

    as_csv = await client.get(
        "/admin/reports/costs",
        params={"group_by": "model", "format": "csv", "from": "2000-01-01", "to": "2100-01-01"},
        headers=ADMIN,
    )
    assert as_csv.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [(r["model"], r["requests"], r["cost_total"], r["savings"], r["usd_per_m_output"])
            for r in table] == [
        ("alpha", "2", "0.0022500000", "0.0000000000", "0.9000000000"),
        ("TOTAL", "2", "0.0022500000", "0.0000000000", "0.9000000000"),
    ]  # fmt: skip


async def test_bad_report_parameters(
    admin: tuple[httpx.AsyncClient, Ledger, CollectorRegistry],
) -> None:
    client, _, _ = admin
    resp = await client.get("/admin/reports/costs", params={"from": "last week"}, headers=ADMIN)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "from"
    resp = await client.get("/admin/reports/costs", params={"group_by": "team,colour"},
                            headers=ADMIN)  # fmt: skip
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, "group_by")
