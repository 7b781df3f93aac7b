"""The dashboard's cost panels run on the real ledger table and add up to what was stored,
in exact USD (the ledger holds integer 1e-10 USD units)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.flow import Cost, Usage
from gateway.ledger.db import make_engine
from gateway.ledger.migrate import upgrade
from gateway.ledger.models import QUANTUM, to_units
from gateway.ledger.report import cost_report
from gateway.ledger.rows import ledger_row
from gateway.ledger.scorecard import SHARE
from gateway.ledger.store import insert_rows
from tests.integration.ledger.factory import make_call
from tests.integration.ledger.postgres import scratch_database
from tests.integration.ledger.test_scorecard import CALLS, COST, served
from tests.unit.deploy.conftest import DASHBOARD, panels

MACROS = {
    r"\$__timeGroupAlias\((\w+), '1h'\)": r"date_trunc('hour', \1) AS time",
    r"\$__timeFilter\((\w+)\)": r"\1 BETWEEN now() - interval '1 day' AND now()",
}
"""Grafana's Postgres macros, expanded as Grafana does for a one-day range."""


def cost_queries() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    out = {}
    for p in panels(dashboard):
        for t in p.get("targets", []):
            if "rawSql" in t:
                sql = t["rawSql"]
                for macro, sub in MACROS.items():
                    sql = re.sub(macro, sub, sql)
                assert "$__" not in sql, f"unexpanded macro in {p['title']!r}"
                out[p["title"]] = sql
    return out


@pytest.fixture
def pg_db_url(pg_server_url: str) -> Iterator[str]:
    with scratch_database(pg_server_url) as url:
        yield url


@pytest.fixture
async def ledger_db(pg_db_url: str) -> AsyncIterator[AsyncEngine]:
    """A migrated ledger of its own holding three priced calls."""
    engine = make_engine(pg_db_url)
    await upgrade(engine)
    half = Decimal("0.5")
    rows = [
        ledger_row(
            make_call("alpha", team=team, usage=Usage(prompt_tokens=100, cached_tokens=60)),
            Cost(total=to_units(Decimal(total)), without_cache=to_units(Decimal(total) + half)),
        )
        for team, total in (("team-a", "1.25"), ("team-b", "2.5"), (None, "0.125"))
    ]
    await insert_rows(engine, rows)
    yield engine
    await engine.dispose()


async def test_cost_panels_query_the_ledger(ledger_db: AsyncEngine) -> None:
    queries = cost_queries()
    assert set(queries) == {"Spend per team", "Spend per model", "Billed vs saved by caching",
                            "Backends and models: speed, cache, cost"}  # fmt: skip
    async with ledger_db.connect() as conn:
        per_team = (await conn.execute(text(queries["Spend per team"]))).mappings().all()
        per_model = (await conn.execute(text(queries["Spend per model"]))).mappings().all()
        totals = (await conn.execute(text(queries["Billed vs saved by caching"]))).mappings().one()
    assert {r["metric"]: r["value"] for r in per_team} == {
        "team-a": Decimal("1.25"),
        "team-b": Decimal("2.5"),
        "(none)": Decimal("0.125"),
    }
    assert {r["metric"]: r["value"] for r in per_model} == {"alpha": Decimal("3.875")}
    assert totals["billed"] == Decimal("3.875")
    assert totals["saved_by_cache"] == Decimal("1.5")
    assert totals["cached_tokens"] == 180
    assert totals["calls"] == 3


async def test_scorecard_panel_agrees_with_the_report(pg_db_url: str) -> None:
    """The panel (percentile_disc over the same counted durations) and `gateway report`
    by backend and model give the same figures, in the same order, for the same rows."""
    engine = make_engine(pg_db_url)
    await upgrade(engine)
    calls = [*CALLS, served("b-slow", 0.0123, 0.0456, model="beta")]  # two models on b-slow
    try:
        await insert_rows(engine, [ledger_row(c, COST if c.usage else Cost()) for c in calls])
        report = await cost_report(engine, None, None, ("backend", "model"))
        sql = cost_queries()["Backends and models: speed, cache, cost"]
        async with engine.connect() as conn:
            panel = (await conn.execute(text(sql))).mappings().all()
    finally:
        await engine.dispose()
    expected = sorted(report.lines, key=lambda line: line.rank_key())
    assert [(r["backend"], r["model"]) for r in panel] == [line.groups for line in expected]
    for row, line in zip(panel, expected, strict=True):
        lat = line.latency
        assert (row["served"], row["refused"], row["failed"]) == (
            line.requests, line.refused, line.failed)  # fmt: skip
        assert (row["ttft_p50_ms"], row["ttft_p95_ms"], row["e2e_p50_ms"]) == (
            lat.ttft_p50_ms, lat.ttft_p95_ms, lat.e2e_p50_ms)  # fmt: skip
        assert row["usd_per_m_prompt"].quantize(QUANTUM) == line.usd_per_m_prompt
        assert row["usd_per_m_output"].quantize(QUANTUM) == line.usd_per_m_output
        assert row["cached_share"].quantize(SHARE) == line.cached_share
        assert row["savings_share"].quantize(SHARE) == line.savings_share
        assert row["billed"] == line.cost_total
