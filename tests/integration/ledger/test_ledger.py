"""A known mix of calls gives exactly the expected ledger rows and report totals.

Every expected figure below is worked out by hand from the prices and token counts, on
Postgres and on the embedded SQLite file alike. Each served call's TTFT is 0.105 s (100 ms
as the report counts it) and its end-to-end time 0.505 s (500 ms).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.flow import Call, Cost, Usage
from gateway.keys.secret import end_user_key, hash_end_user
from gateway.ledger import Ledger
from gateway.ledger.db import make_engine
from gateway.ledger.migrate import upgrade
from gateway.ledger.models import LedgerRow, Price, to_usd
from gateway.ledger.report import cost_report, report_query
from gateway.ledger.rows import ledger_row
from gateway.ledger.store import insert_rows
from gateway.ledger.writer import LedgerWriter
from tests.integration.ledger.factory import ledger_settings, make_call, record

PRICES = {
    "alpha": {"input": "0.15", "cached_input": "0.075", "output": "0.60"},
    "beta": {"input": "3", "cached_input": "0.30", "cache_write": "3.75", "output": "15"},
    "gamma": {"input": "0.123456789", "cached_input": "0.0123456789", "output": "0.3333333333"},
}


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(db_url)
    yield engine
    await engine.dispose()


def the_mix() -> list[Call]:
    return [
        make_call("alpha", usage=Usage(1000, 0, 200)),
        make_call("alpha", usage=Usage(1000, 768, 50), stream=True),
        make_call("beta", team="team-b", key="key-2", stream=True, disconnected=True,
                  usage=Usage(333, 0, 17, estimated=True)),
        make_call("beta", team="team-b", key="key-2", status=503,
                  error_type="backend_unavailable"),
        make_call("beta", team="team-b", key="key-2",
                  usage=Usage(2000, 0, 1, cache_write_tokens=1500)),
        make_call("gamma", key="key-3", served_by="coalesced", usage=Usage(7, 3, 1)),
    ]  # fmt: skip


# (input_tokens, cost_input, cost_cached_input, cost_cache_write, cost_output, total, without)
EXPECTED_COSTS = [
    (1000, "0.0001500000", "0", "0", "0.0001200000", "0.0002700000", "0.0002700000"),
    (232, "0.0000348000", "0.0000576000", "0", "0.0000300000", "0.0001224000", "0.0001800000"),
    (333, "0.0009990000", "0", "0", "0.0002550000", "0.0012540000", "0.0012540000"),
    (0, "0", "0", "0", "0", "0", "0"),
    (500, "0.0015000000", "0", "0.0056250000", "0.0000150000", "0.0071400000", "0.0060150000"),
    (4, "0.0000004938", "0.0000000370", "0", "0.0000003333", "0.0000008641", "0.0000011975"),
]

TEAM_REPORT = {
    "team-a": {
        "requests": 3, "refused": 0, "failed": 0, "prompt_tokens": 2007, "input_tokens": 1236,
        "cached_tokens": 771,
        "cache_write_tokens": 0, "completion_tokens": 251,
        "cost_input": "0.0001852938", "cost_cached_input": "0.0000576370",
        "cost_cache_write": "0.0000000000", "cost_output": "0.0001503333",
        "cost_total": "0.0003932641", "cost_without_cache": "0.0004511975",
        "savings": "0.0000579334",
        # 771 / 2007; 0.0000579334 / 0.0004511975; 0.0002429308 per 2007 tokens;
        # 0.0001503333 per 251 tokens.
        "cached_share": "0.3842", "savings_share": "0.1284",
        "usd_per_m_prompt": "0.1210417539", "usd_per_m_output": "0.5989374502",
        "ttft_p50_ms": 100, "ttft_p95_ms": 100, "e2e_p50_ms": 500,
    },
    "team-b": {
        "requests": 2, "refused": 0, "failed": 1, "prompt_tokens": 2333, "input_tokens": 833,
        "cached_tokens": 0,
        "cache_write_tokens": 1500, "completion_tokens": 18,
        "cost_input": "0.0024990000", "cost_cached_input": "0.0000000000",
        "cost_cache_write": "0.0056250000", "cost_output": "0.0002700000",
        "cost_total": "0.0083940000", "cost_without_cache": "0.0072690000",
        "savings": "-0.0011250000",
        # Writing the cache cost more than it saved: -0.001125 / 0.007269.
        "cached_share": "0.0000", "savings_share": "-0.1548",
        "usd_per_m_prompt": "3.4822117445", "usd_per_m_output": "15.0000000000",
        "ttft_p50_ms": 100, "ttft_p95_ms": 100, "e2e_p50_ms": 500,
    },
    "TOTAL": {
        "requests": 5, "refused": 0, "failed": 1, "prompt_tokens": 4340, "input_tokens": 2069,
        "cached_tokens": 771,
        "cache_write_tokens": 1500, "completion_tokens": 269,
        "cost_input": "0.0026842938", "cost_cached_input": "0.0000576370",
        "cost_cache_write": "0.0056250000", "cost_output": "0.0004203333",
        "cost_total": "0.0087872641", "cost_without_cache": "0.0077201975",
        "savings": "-0.0010670666",
        "cached_share": "0.1776", "savings_share": "-0.1382",
        "usd_per_m_prompt": "1.9278642396", "usd_per_m_output": "1.5625773234",
        "ttft_p50_ms": 100, "ttft_p95_ms": 100, "e2e_p50_ms": 500,
    },
}  # fmt: skip


async def rows(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        return list((await conn.execute(select(LedgerRow).order_by(LedgerRow.id))).all())


async def price_ids(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {p.model: p.id for p in (await conn.execute(select(Price))).all()}


async def test_mix_gives_exact_rows_and_report(
    db_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    ledger = Ledger(ledger_settings(db_url, tmp_path / "spool", PRICES), CollectorRegistry())
    await ledger.start()
    calls = the_mix()
    for call in calls:
        record(ledger, call)
    await ledger.aclose()

    ids = await price_ids(engine)
    written = await rows(engine)
    assert [r.request_id for r in written] == [c.id for c in calls]
    for call, row, expected in zip(calls, written, EXPECTED_COSTS, strict=True):
        input_tokens, *money = expected
        usage = call.usage or Usage()
        assert (row.prompt_tokens, row.cached_tokens, row.cache_write_tokens) == (
            usage.prompt_tokens, usage.cached_tokens, usage.cache_write_tokens)  # fmt: skip
        assert (row.input_tokens, row.completion_tokens) == (input_tokens, usage.completion_tokens)
        costs = (row.cost_input, row.cost_cached_input, row.cost_cache_write, row.cost_output,
                 row.cost_total, row.cost_without_cache)  # fmt: skip
        assert tuple(map(to_usd, costs)) == tuple(Decimal(m) for m in money)
        assert call.cost == Cost(*costs, price_id=row.price_id)
        assert row.price_id == ids[call.model or ""]
        assert row.ts.timestamp() == pytest.approx(call.received_wall, abs=1e-5)
        assert call.principal is not None
        assert (row.key_id, row.team) == (call.principal.key_id, call.principal.team)
        assert (row.model, row.backend, row.decision) == (call.model, "b1", "hit")
        assert (row.ttft_s, row.latency_s) == (pytest.approx(0.105), pytest.approx(0.505))
    flags = [(r.stream, r.disconnected, r.estimated, r.status, r.error_type, r.served_by)
             for r in written]  # fmt: skip
    assert flags == [
        (False, False, False, 200, None, "upstream"),
        (True, False, False, 200, None, "upstream"),
        (True, True, True, 200, None, "upstream"),
        (False, False, False, 503, "backend_unavailable", "upstream"),
        (False, False, False, 200, None, "upstream"),
        (False, False, False, 200, None, "coalesced"),
    ]

    report = (await cost_report(engine, None, None, ("team",))).to_json()
    got = {line.pop("team"): line for line in report["rows"]} | {"TOTAL": report["totals"]}
    assert got == TEAM_REPORT
    async with engine.connect() as conn:
        total = (await conn.execute(select(func.sum(LedgerRow.cost_total)))).scalar_one()
    assert to_usd(total) == Decimal(str(TEAM_REPORT["TOTAL"]["cost_total"]))
    by_model = (await cost_report(engine, None, None, ("model",))).to_json()
    # Cheapest effective prompt price first: gamma 0.0000005308 for 7 tokens (0.0758 per
    # million), alpha 0.0002424 for 2000 (0.1212), beta 0.008124 for 2333 (3.48).
    assert [(r["model"], r["cost_total"], r["usd_per_m_prompt"]) for r in by_model["rows"]] == [
        ("gamma", "0.0000008641", "0.0758285714"), ("alpha", "0.0003924000", "0.1212000000"),
        ("beta", "0.0083940000", "3.4822117445"),
    ]  # fmt: skip
    assert by_model["totals"] == report["totals"]
    by_team_model = (await cost_report(engine, None, None, ("team", "model"))).to_json()
    assert [(r["team"], r["model"], r["requests"], r["failed"])
            for r in by_team_model["rows"]] == [
        ("team-a", "alpha", 2, 0), ("team-a", "gamma", 1, 0), ("team-b", "beta", 2, 1)
    ]  # fmt: skip
    assert by_team_model["totals"] == report["totals"]


async def test_price_change_never_reprices_the_past(
    db_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    ledger = Ledger(ledger_settings(db_url, tmp_path / "spool", PRICES), CollectorRegistry())
    await ledger.start()
    before = make_call("alpha", usage=Usage(1000, 0, 1000))
    record(ledger, before)
    old = ledger.prices_for("alpha")
    await asyncio.sleep(0.01)  # the new version must start strictly after `before` was received
    new = await ledger.set_price("alpha", (Decimal("0.30"), Decimal("0.03"), Decimal(0),
                                           Decimal("1.20")))  # fmt: skip
    after = make_call("alpha", usage=Usage(1000, 0, 1000))
    late = make_call("alpha", usage=Usage(1000, 0, 1000), received_wall=before.received_wall)
    record(ledger, after)
    record(ledger, late)  # a stream that began before the change and ended after it
    await ledger.aclose()

    assert old is not None
    assert (new.id, new.effective_from > old.effective_from) == (old.id + 3, True)
    written = {r.request_id: r for r in await rows(engine)}
    assert to_usd(written[before.id].cost_total) == Decimal("0.00075")  # 1000 * 0.15 + 1000 * 0.60
    assert written[before.id].price_id == old.id
    assert to_usd(written[late.id].cost_total) == Decimal("0.00075")
    assert written[late.id].price_id == old.id
    assert to_usd(written[after.id].cost_total) == Decimal("0.0015")  # 1000 * 0.30 + 1000 * 1.20
    assert written[after.id].price_id == new.id
    history = ledger.price_history("alpha")
    assert [v.source for v in history] == ["config", "admin"]


async def test_same_request_id_is_counted_once(
    db_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    written: list[str] = []
    ledger = Ledger(
        ledger_settings(db_url, tmp_path / "spool", PRICES),
        CollectorRegistry(),
        on_written=lambda batch: written.extend(r.request_id for r in batch),
    )
    await ledger.start()
    call = make_call("alpha", usage=Usage(10, 0, 10))
    record(ledger, call)
    await ledger.aclose()
    await ledger.start()
    record(ledger, call)  # e.g. a retried write after a reply that never arrived
    fresh = make_call("alpha", usage=Usage(20, 0, 20))
    record(ledger, fresh)  # in the same batch as the repeat: written, and counted, once
    await ledger.aclose()

    assert [r.request_id for r in await rows(engine)] == [call.id, fresh.id]
    assert written == [call.id, fresh.id]


async def test_config_price_synced_only_when_changed(
    db_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    for prices in (PRICES, PRICES, {"alpha": {**PRICES["alpha"], "output": "0.61"}}):
        ledger = Ledger(ledger_settings(db_url, tmp_path / "spool", prices), CollectorRegistry())
        await ledger.start()
        await ledger.aclose()
    async with engine.connect() as conn:
        versions = (await conn.execute(select(Price.model, Price.output).order_by(Price.id))).all()
    assert [(m, str(o)) for m, o in versions] == [
        ("alpha", "0.6000000000"), ("beta", "15.0000000000"), ("gamma", "0.3333333333"),
        ("alpha", "0.6100000000"),
    ]  # fmt: skip


async def test_day_reports_use_the_planner_statistics(pg_db_url: str, tmp_path: Path) -> None:
    """The report's day expression must be the one the migration gathers statistics on."""
    ledger = Ledger(ledger_settings(pg_db_url, tmp_path / "spool", PRICES), CollectorRegistry())
    await ledger.start()
    days = [1767225600.0 + 86400 * (i % 3) + i for i in range(1000)]  # 2026-01-01 .. 01-03
    for day in days:
        record(ledger, make_call("alpha", usage=Usage(10, 0, 1), received_wall=day))
    await ledger.aclose()
    query = report_query("postgresql", None, None, ("day",)).compile(
        dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
    )
    conn = await asyncpg.connect(pg_db_url)
    try:
        await conn.execute("ANALYZE ledger")
        plan = json.loads(await conn.fetchval(f"EXPLAIN (FORMAT JSON) {query}"))
    finally:
        await conn.close()
    assert plan[0]["Plan"]["Plan Rows"] == 3  # without them: a group per distinct ts


async def test_receive_time_is_stored_to_the_microsecond(db_url: str, engine: AsyncEngine) -> None:
    """The writer encodes epoch seconds for timestamptz itself (no datetime per call)."""
    await upgrade(engine)
    walls = (1_800_000_000.123456, 946_684_799.999999, 1_767_225_600.0)
    calls = [make_call("alpha", received_wall=w) for w in walls]
    await insert_rows(engine, [ledger_row(c, Cost()) for c in calls])
    async with engine.connect() as conn:
        stored = (await conn.execute(select(LedgerRow.ts).order_by(LedgerRow.id))).scalars().all()
    assert stored == [
        datetime(2027, 1, 15, 8, 0, 0, 123456, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 1, 1, tzinfo=UTC),
    ]


async def test_a_report_by_end_user_totals_each_end_users_calls_exactly(
    db_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    """safety_identifier or user, grouped by its hash: a team sees what each of its end
    users spends, and no end user's name is in the report."""
    ledger = Ledger(ledger_settings(db_url, tmp_path / "spool", PRICES), CollectorRegistry())
    await ledger.start()
    spent = {"ada@example.com": [1000, 3000], "bob": [2000], None: [500]}
    for end_user, prompts in spent.items():
        for prompt in prompts:
            call = make_call("alpha", usage=Usage(prompt, 0, 10))
            assert call.request is not None
            call.request.end_user = end_user
            record(ledger, call)
    await ledger.aclose()
    report = (await cost_report(engine, None, None, ("user",))).to_json()
    key = end_user_key(ledger_settings(db_url, tmp_path, PRICES).auth.pepper)
    got = {line["user"]: (line["requests"], line["prompt_tokens"], line["cost_total"])
           for line in report["rows"]}  # fmt: skip
    price = PRICES["alpha"]
    assert got == {
        (None if name is None else hash_end_user(name, key)): (
            len(prompts), sum(prompts),
            str(sum(((Decimal(p) * Decimal(price["input"]) + 10 * Decimal(price["output"]))
                     / 1_000_000 for p in prompts), Decimal(0)).quantize(Decimal("1E-10"))),
        )
        for name, prompts in spent.items()
    }  # fmt: skip
    assert "ada@example.com" not in str(report)  # the whole name: "ada" is made of hex digits


async def test_an_idle_writer_takes_no_steps_until_a_row_comes(
    db_url: str, engine: AsyncEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing queued, nothing to do: no wake-up every flush_interval (20 ms here)."""
    steps: list[int] = []
    step = LedgerWriter._step

    async def counted(self: LedgerWriter) -> None:
        steps.append(self.depth)
        await step(self)

    monkeypatch.setattr(LedgerWriter, "_step", counted)
    settings = ledger_settings(db_url, tmp_path / "spool", PRICES, flush_interval=0.02)
    ledger = Ledger(settings, CollectorRegistry())
    await ledger.start()
    try:
        await asyncio.sleep(0.3)
        assert steps == []
        call = make_call("alpha", usage=Usage(10, 0, 1))
        record(ledger, call)
        for _ in range(200):
            if await rows(engine):
                break
            await asyncio.sleep(0.01)
        assert [r.request_id for r in await rows(engine)] == [call.id]
        assert steps[0] == 1  # woken by the row, which waited for no other
    finally:
        await ledger.aclose()
