"""The scorecard figures of known rows, worked out by hand, on Postgres and SQLite alike.

Durations count in milliseconds to two significant digits, rounded down; a percentile is
the nearest rank (the smallest value with at least p% of the values at or below it). Every
duration sits mid-way in its count's range: a stored duration is the difference of two
clock readings, a hair off the figure written here.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.flow import Call, Cost, Usage
from gateway.ledger.report import cost_report
from gateway.ledger.rows import ledger_row
from gateway.ledger.store import insert_rows
from tests.integration.ledger.factory import make_call


def timed(call: Call, ttft: float, e2e: float) -> Call:
    call.first_byte_at, call.done_at = call.received_at + ttft, call.received_at + e2e
    return call


def served(
    backend: str, ttft: float, e2e: float, *, model: str = "alpha", stream: bool = True, **kw: Any
) -> Call:
    usage = Usage(prompt_tokens=1000, cached_tokens=600, completion_tokens=100)
    call = make_call(model, backend=backend, stream=stream, usage=usage, **kw)
    return timed(call, ttft, e2e)


# 1000 prompt tokens (600 cached, 400 standard), 100 output: at $1, $0.10 and $2 per
# million that is 0.0004 + 0.00006 prompt and 0.0002 output; uncached 0.001 + 0.0002.
COST = Cost(input=4_000_000, cached_input=600_000, output=2_000_000, total=6_600_000,
            without_cache=12_000_000)  # fmt: skip

CALLS = [
    # b-fast: five streamed calls, one not streamed, one refused, one failed.
    served("b-fast", 0.0123, 0.5049),  # counted 12 ms, 500 ms
    served("b-fast", 0.0456, 0.6149),  # 45, 610
    served("b-fast", 0.0789, 0.7249),  # 78, 720
    served("b-fast", 0.2468, 1.2345),  # 240, 1200
    served("b-fast", 3.2345, 12.5, disconnected=True, status=499),  # 3200, 12000: served
    served("b-fast", 0.9, 0.0875, stream=False),  # no TTFT (not streamed); 87 ms end to end
    make_call("alpha", backend="b-fast", status=429, error_type="rate_limit_error"),
    make_call("alpha", backend="b-fast", status=502, error_type="bad_gateway"),
    # b-slow: two streamed calls.
    served("b-slow", 0.3149, 2.049),  # 310, 2000
    served("b-slow", 0.5549, 2.549),  # 550, 2500
]


async def test_every_figure_by_hand(engine: AsyncEngine) -> None:
    await insert_rows(engine, [ledger_row(c, COST if c.usage else Cost()) for c in CALLS])
    report = await cost_report(engine, None, None, ("backend",))
    got = {line["backend"]: line for line in report.to_json()["rows"]}
    totals = report.to_json()["totals"]

    fast, slow = got["b-fast"], got["b-slow"]
    assert (fast["requests"], fast["refused"], fast["failed"]) == (6, 1, 1)
    assert (slow["requests"], slow["refused"], slow["failed"]) == (2, 0, 0)
    assert (totals["requests"], totals["refused"], totals["failed"]) == (8, 1, 1)
    for line, n in ((fast, 6), (slow, 2), (totals, 8)):
        assert line["prompt_tokens"] == 1000 * n
        assert line["cached_share"] == "0.6000"  # 600 / 1000
        assert line["savings_share"] == "0.4500"  # (0.0012 - 0.00066) / 0.0012
        assert line["usd_per_m_prompt"] == "0.4600000000"  # 0.00046 per 1000 tokens
        assert line["usd_per_m_output"] == "2.0000000000"
        assert line["cost_total"] == format(Decimal("0.00066") * n, ".10f")

    # b-fast TTFT (streamed, served): 12 45 78 240 3200. p50: rank ceil(2.5) = 3 -> 78;
    # p95: rank ceil(4.75) = 5 -> 3200. End to end (all six served): 87 500 610 720 1200
    # 12000: p50 rank 3 -> 610.
    assert (fast["ttft_p50_ms"], fast["ttft_p95_ms"], fast["e2e_p50_ms"]) == (78, 3200, 610)
    # b-slow: TTFT 310 550 -> p50 rank 1: 310, p95 rank 2: 550; end to end 2000 2500 -> 2000.
    assert (slow["ttft_p50_ms"], slow["ttft_p95_ms"], slow["e2e_p50_ms"]) == (310, 550, 2000)
    # All: TTFT 12 45 78 240 310 550 3200 (7): p50 rank 4 -> 240, p95 rank 7 -> 3200.
    # End to end 87 500 610 720 1200 2000 2500 12000 (8): p50 rank 4 -> 720.
    assert (totals["ttft_p50_ms"], totals["ttft_p95_ms"], totals["e2e_p50_ms"]) == (
        240, 3200, 720)  # fmt: skip
    # Same effective price: the faster TTFT comes first.
    assert list(got) == ["b-fast", "b-slow"]


async def test_a_cheaper_line_ranks_first_and_empty_figures_are_none(
    engine: AsyncEngine,
) -> None:
    cheap = Cost(input=1_000_000, output=2_000_000, total=3_000_000, without_cache=3_000_000)
    calls = [served("b-slow", 0.5049, 1.0049), served("b-fast", 0.0505, 0.1049)]
    rows = [ledger_row(calls[0], cheap), ledger_row(calls[1], COST)]
    refused = make_call("alpha", backend="b-none", status=401, error_type="invalid_request")
    await insert_rows(engine, [*rows, ledger_row(refused, Cost())])
    report = (await cost_report(engine, None, None, ("backend",))).to_json()
    assert [(r["backend"], r["usd_per_m_prompt"]) for r in report["rows"]] == [
        ("b-slow", "0.1000000000"), ("b-fast", "0.4600000000"), ("b-none", None)
    ]  # fmt: skip
    none = report["rows"][-1]
    empty = (none["cached_share"], none["savings_share"], none["ttft_p50_ms"], none["e2e_p50_ms"])
    assert (*empty, none["refused"]) == (None, None, None, None, 1)


async def test_combined_groupings_rank_within_each_group(engine: AsyncEngine) -> None:
    times = (("t1", 0.0115, 0.0225), ("t1", 0.0225, 0.0445), ("t1", 0.0335, 0.0665),
             ("t2", 0.5049, 1.0049), ("t2", 0.0445, 0.0885))  # fmt: skip
    calls = [served("b1", ttft, e2e, team=team) for team, ttft, e2e in times]
    await insert_rows(engine, [ledger_row(c, COST) for c in calls])
    report = (await cost_report(engine, None, None, ("team", "backend"))).to_json()
    got = [(r["team"], r["ttft_p50_ms"], r["ttft_p95_ms"], r["e2e_p50_ms"]) for r in report["rows"]]
    # t1: 11 22 33 -> p50 rank 2 = 22, p95 rank 3 = 33; e2e 22 44 66 -> 44.
    # t2: 44 500 -> p50 rank 1 = 44, p95 rank 2 = 500; e2e 88 1000 -> 88.
    assert got == [("t1", 22, 33, 44), ("t2", 44, 500, 88)]
    assert report["totals"]["ttft_p50_ms"] == 33  # 11 22 33 44 500: rank 3


async def test_table_stars_the_cheapest_and_the_fastest(engine: AsyncEngine) -> None:
    cheap = Cost(input=1_000_000, output=2_000_000, total=3_000_000, without_cache=3_000_000)
    calls = [served("b-slow", 0.5049, 1.0049), served("b-fast", 0.0505, 0.1049)]
    await insert_rows(engine, [ledger_row(calls[0], cheap), ledger_row(calls[1], COST)])
    table = (await cost_report(engine, None, None, ("backend",))).to_table().splitlines()
    assert table[0].split() == ["backend", "served", "refused", "failed", "billed_usd",
        "cached", "saved", "usd/M_prompt", "usd/M_output", "ttft_p50_ms", "ttft_p95_ms",
        "e2e_p50_ms"]  # fmt: skip
    assert table[1].split() == ["b-slow", "1", "0", "0", "0.0003000000", "60.00%", "0.00%",
        "0.1000000000", "*", "2.0000000000", "500", "500", "1000"]  # fmt: skip
    assert table[2].split() == ["b-fast", "1", "0", "0", "0.0006600000", "60.00%", "45.00%",
        "0.4600000000", "2.0000000000", "50", "*", "50", "100"]  # fmt: skip
    assert table[3].split()[:2] == ["TOTAL", "2"]
