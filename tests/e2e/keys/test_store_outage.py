"""Postgres goes away under a gateway with auth on: keys it confirmed recently keep working
for auth.stale_for, keys it cannot check get 503 (never 401), admin routes 503, /ready
says what is degraded, and every answered call has its ledger row once Postgres is back.

The gateway is a real process; Postgres is a private server this test stops and starts.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import httpx

from tests.e2e.conftest import MODEL, write_config
from tests.e2e.keys.conftest import ADMIN, auth_sections, issue_key
from tests.integration.ledger.postgres import PrivatePostgres
from tests.servers import gateway_process

CACHE_TTL = 1.0
STALE_FOR = 6.0
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def chat(url: str, key: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/v1/chat/completions", json=BODY, headers=headers, timeout=30)


def admin_get(url: str, path: str) -> httpx.Response:
    return httpx.get(url + path, headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)


def assert_store_unavailable(resp: httpx.Response) -> None:
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["type"] == "service_unavailable"
    assert resp.json()["error"]["code"] == "store_unavailable"
    assert int(resp.headers["retry-after"]) > 0


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def ledger_statuses(url: str) -> list[int]:
    async def fetch() -> list[int]:
        conn = await asyncpg.connect(url, timeout=5)
        try:
            return [r[0] for r in await conn.fetch("SELECT status FROM ledger ORDER BY id")]
        finally:
            await conn.close()

    return asyncio.run(fetch())


def test_a_key_store_outage_degrades_what_it_must_and_says_so(
    sims: list[str], private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    sections = auth_sections(private_pg.url)
    sections["auth"].update(cache_ttl=CACHE_TTL, stale_for=STALE_FOR)
    cfg = write_config(tmp_path / "g.yaml", sims, **sections)
    with gateway_process("serve", "--config", str(cfg)) as url:
        _, known = issue_key(url, "outage")
        _, unseen = issue_key(url, "outage")  # issued, never used through this gateway
        confirmed = time.monotonic()  # the store's last word on `known` comes after this
        assert chat(url, known).status_code == 200
        ready = httpx.get(url + "/ready", timeout=10)
        assert (ready.status_code, ready.json()["status"]) == (200, "ready")

        private_pg.stop("fast")
        time.sleep(CACHE_TTL * 1.5)  # `known`'s cached answer has expired
        answered = 0
        for _ in range(3):
            assert chat(url, known).status_code == 200
            answered += 1
        assert_store_unavailable(chat(url, unseen))
        assert_store_unavailable(chat(url, "gk-" + "u" * 43))  # unknown, not "invalid"
        assert chat(url, None).status_code == 401  # no key at all needs no store
        for path in ("/admin/reports/costs", "/admin/keys", "/admin/teams"):
            assert_store_unavailable(admin_get(url, path))
        ready = httpx.get(url + "/ready", timeout=10)
        body = ready.json()
        assert ready.status_code == 200  # degraded, still serving
        assert body["status"] == "degraded"
        assert body["degraded"] == ["keys", "ledger"]
        assert body["ledger"]["database"] == "unreachable"
        assert (body["keys"]["store"], body["keys"]["stale_keys"]) == ("unreachable", 1)
        assert body["backends"] == {MODEL: {"healthy": 1, "total": 1}}
        assert metric(url, "gateway_auth_stale_keys") == 1

        # Past stale_for (after the store last confirmed it), the record is trusted no longer.
        deadline = confirmed + STALE_FOR + 4 * CACHE_TTL + 10
        while (resp := chat(url, known)).status_code == 200 and time.monotonic() < deadline:
            answered += 1
            time.sleep(0.25)
        assert time.monotonic() - confirmed > STALE_FOR
        assert_store_unavailable(resp)

        private_pg.start()
        deadline = time.monotonic() + 30
        while (resp := chat(url, known)).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.25)
        assert resp.status_code == 200
        answered += 1
        deadline = time.monotonic() + 30
        while httpx.get(url + "/ready", timeout=10).json()["status"] != "ready":
            assert time.monotonic() < deadline, httpx.get(url + "/ready").text
            time.sleep(0.25)

    statuses = ledger_statuses(private_pg.url)  # the gateway flushed its spool at exit
    assert statuses.count(200) == 1 + answered
