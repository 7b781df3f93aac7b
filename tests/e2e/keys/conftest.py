"""Gateways with auth on (Postgres ledger) and helpers to issue keys through the admin API."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import start_sims
from tests.integration.ledger.postgres import scratch_database

ADMIN = "admin-secret-for-tests"
PEPPER = "e2e-pepper"


@pytest.fixture(scope="package")
def keys_db(pg_server_url: str) -> Iterator[str]:
    """A Postgres database of these tests' own (the session's pg_url is counted row by row
    by the ledger's tests, so gateways here must not write into it)."""
    with scratch_database(pg_server_url) as url:
        yield url


@pytest.fixture(scope="package")
def sims() -> Iterator[list[str]]:
    """One simulator for every gateway here (refused calls are checked on its counters)."""
    with ExitStack() as stack:
        yield start_sims(stack, 1)


def auth_sections(db_url: str, **extra: Any) -> dict[str, Any]:
    """Config sections: Postgres (so auth is on by default), migrated at start."""
    return {
        "database": {"url": db_url, "auto_migrate": True},
        "auth": {"admin_key": ADMIN, "pepper": PEPPER},
        **extra,
    }


def admin(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)


def issue_key(url: str, team: str, team_limits: dict[str, Any] | None = None,
              **spec: Any) -> tuple[str, str]:  # fmt: skip
    """Create the team if needed and a key in it; returns (key id, secret)."""
    with admin(url) as client:
        teams = {t["name"] for t in client.get("/admin/teams").json()["data"]}
        if team not in teams:
            r = client.post("/admin/teams", json={"name": team, **(team_limits or {})})
            assert r.status_code == 201, r.text
        r = client.post("/admin/keys", json={"team": team, **spec})
        assert r.status_code == 201, r.text
        body = r.json()
        return body["id"], body["key"]


def backend_requests(sims: list[str]) -> float:
    """Requests the simulators finished, summed: to show a refused call reached none."""
    total = 0.0
    for base in sims:
        text = httpx.get(base + "/metrics").text
        for fam in text_string_to_metric_families(text):
            total += sum(s.value for s in fam.samples if s.name == "vllm:request_success_total")
    return total
