"""The routing benchmark's checks, on made-up results whose verdicts are known."""

from __future__ import annotations

from gateway.bench.judge import Check, Result, judge, markdown, markdown_checks, render_checks


def result(
    setup: str,
    hit: float,
    p50: float,
    p99: float,
    work: float,
    calls: float | None = None,
    **kw: object,
) -> Result:
    """A run whose steady window has the same figures as the whole run; its calls are as
    uneven as its work unless ``calls`` says otherwise."""
    calls = work if calls is None else calls
    return Result(setup=setup, workload=str(kw.get("workload", "agents")), seed=0, rate=10.0,
                 requests=100, ok=100, errors={}, hit_ratio=hit, ttft_p50_ms=p50,
                 ttft_p99_ms=p99, instances={"a": 60, "b": 40}, imbalance=calls,
                 balanceable=bool(kw.get("balanceable", True)), steady_hit=hit,
                 steady_p50_ms=p50, steady_p99_ms=p99, steady_imbalance=calls,
                 work_imbalance=work, steady_work_imbalance=work)  # fmt: skip


def verdicts(checks: list[Check], window: str = "whole") -> dict[str, bool]:
    return {c.goal: c.ok for c in checks if c.window == window}


def test_every_goal_against_its_reference() -> None:
    rows = [
        result("gw-cache-aware", 0.88, 40, 300, 1.25),
        result("sticky", 0.90, 38, 170, 1.0),
        result("gw-round-robin", 0.70, 80, 250, 1.0),
        result("vllm-consistent-hash", 0.90, 39, 200, 1.1),
        result("sglang-cache-aware", 0.86, 45, 210, 1.3),
    ]
    got = verdicts(judge(rows))
    assert got == {
        "hit >= 0.97 sticky": True,  # 0.88 >= 0.873
        "hit >= best peer": False,  # 0.88 < 0.90
        "p99 <= round robin": False,  # 300 > 250
        "p99 < every peer": False,
        "p50 <= best peer": False,  # 40 > 39
        "work max/mean <= 1.2": False,
    }
    assert verdicts(judge(rows), "steady") == got
    (hit,) = [c for c in judge(rows) if c.goal == "hit >= best peer" and c.window == "whole"]
    assert (hit.mine, hit.reference) == (0.88, 0.90)


def test_a_winner_passes_and_missing_references_are_left_out() -> None:
    rows = [
        result("gw-cache-aware", 0.95, 30, 100, 1.1),
        result("vllm-cache-aware", 0.90, 35, 150, 1.5),
    ]
    got = verdicts(judge(rows))
    assert got == {
        "hit >= best peer": True,
        "p99 < every peer": True,
        "p50 <= best peer": True,
        "work max/mean <= 1.2": True,
    }


def test_balance_is_not_judged_where_the_scenario_cannot_be_balanced() -> None:
    rows = [result(name, 0.9, 30, 100, 1.5, balanceable=False)
            for name in ("gw-cache-aware", "sticky")]  # fmt: skip
    assert "work max/mean <= 1.2" not in verdicts(judge(rows))


def test_balance_is_judged_by_work_not_by_calls() -> None:
    rows = [
        result("gw-cache-aware", 0.9, 30, 100, 1.1, calls=1.4),
        result("sticky", 0.9, 30, 100, 1.3, calls=1.0),
    ]
    (check,) = [c for c in judge(rows) if c.goal.startswith("work") and c.window == "whole"]
    assert (check.mine, check.ok) == (1.1, True)
    assert "1.10 (1.40)" in markdown(rows)


def test_repeated_runs_are_averaged_and_scenarios_judged_apart() -> None:
    rows = [
        result("gw-cache-aware", 0.80, 30, 100, 1.0),
        result("gw-cache-aware", 0.90, 30, 100, 1.0),
        result("sticky", 0.88, 30, 100, 1.0),
        result("gw-cache-aware", 0.10, 30, 100, 1.0, workload="documents"),
        result("sticky", 0.90, 30, 100, 1.0, workload="documents"),
    ]
    checks = [c for c in judge(rows) if c.goal == "hit >= 0.97 sticky" and c.window == "whole"]
    assert [(c.scenario, round(c.mine, 2), c.ok) for c in checks] == [
        ("agents", 0.85, False),
        ("documents", 0.10, False),
    ]


def test_tables_name_every_check() -> None:
    rows = [result("gw-cache-aware", 0.9, 30, 100, 1.0), result("sticky", 0.9, 30, 90, 1.0)]
    checks = judge(rows)
    text = render_checks(checks)
    assert "ok 0.900 / 0.873" in text
    assert text.splitlines()[-1] == "4 of 4 checks met"
    assert markdown_checks(checks).splitlines()[2].startswith("| agents | 0 | whole | ok 0.900")
    assert markdown(rows).splitlines()[2] == "| gw-cache-aware | 0.90 / 30 / 100 / 1.00 (1.00) |"
