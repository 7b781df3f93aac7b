"""/ready names each part and its state; 200 while any call can be served."""

from __future__ import annotations

from tests.integration.conftest import InProcess


async def test_an_embedded_gateway_is_ready_and_says_what_it_runs_on(in_process: InProcess) -> None:
    resp = await in_process.client.get("/ready")
    assert resp.status_code == 200
    assert resp.json() == {
        "status": "ready",
        "degraded": [],
        "backends": {"sim-model": {"healthy": 1, "total": 1}},
        "ledger": {"status": "ok", "database": "reachable", "spool_rows": 0},
        "keys": {"status": "off"},
        "index": {"status": "ok", "store": "in-process"},
        "limits": {"status": "ok", "store": "in-process"},
    }


async def test_a_ledger_that_cannot_reach_its_database_is_reported_spooling(
    in_process: InProcess,
) -> None:
    await in_process.services.ledger.engine.dispose()
    in_process.ledger_db.unlink()
    in_process.ledger_db.mkdir()  # where the file was, nothing SQLite can open
    resp = await in_process.client.get("/ready")
    assert resp.status_code == 200  # degraded, still serving
    body = resp.json()
    assert (body["status"], body["degraded"]) == ("degraded", ["ledger"])
    assert body["ledger"] == {"status": "spooling", "database": "unreachable", "spool_rows": 0}
    in_process.ledger_db.rmdir()


async def test_limits_no_longer_shared_are_reported_with_what_they_do(
    in_process: InProcess,
) -> None:
    degraded = in_process.services.limits.metrics.degraded
    degraded.labels("local").set(1)  # as the Redis limiter sets it when Redis is unreachable
    body = (await in_process.client.get("/ready")).json()
    assert body["limits"] == {"status": "degraded", "store": "in-process", "mode": "local"}
    assert body["degraded"] == ["limits"]
    degraded.labels("local").set(0)
    assert (await in_process.client.get("/ready")).json()["limits"]["status"] == "ok"
