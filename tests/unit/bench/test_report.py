"""Reports from known samples: figures, table, JSON and comparison ratios."""

from __future__ import annotations

import orjson
import pytest

from gateway.bench.client import Sample
from gateway.bench.report import Report, RunInfo, ratios, render, render_ratios, summarize
from gateway.bench.workloads import Turn

INFO = RunInfo(workload="shared-prefix", seed=3, model="m", load="concurrency=2")


def sample(n: int, *, ttft: float, latency: float, instance: str = "a", **kw: object) -> Sample:
    turn = Turn(f"c{n}", 0, "sys", f"question {n}", 8)
    s = Sample(turn=turn, started=0.0, ttft=ttft, latency=latency, instance=instance)
    s.prompt_tokens, s.cached_tokens, s.completion_tokens = 100, 50, 8
    for key, value in kw.items():
        setattr(s, key, value)
    return s


def samples() -> list[Sample]:
    ok = [
        sample(i, ttft=0.01 * i, latency=0.1 * i, gaps=[0.001, 0.003], instance="ab"[i % 2])
        for i in range(1, 5)
    ]
    failed = Sample(turn=Turn("c9", 0, "", "x", 1), started=0.0, error="HTTP 503")
    timeout = Sample(turn=Turn("c8", 0, "", "y", 1), started=0.0, error="TimeoutError")
    return [*ok, failed, timeout]


def build(items: list[Sample], elapsed: float = 2.0, target: str = "t") -> Report:
    return summarize(items, target=target, base_url="http://h/v1", info=INFO, elapsed=elapsed)


def test_summary_figures() -> None:
    r = build(samples())
    assert (r.requests, r.ok) == (6, 4)
    assert r.errors == {"HTTP 503": 1, "TimeoutError": 1}
    assert r.ttft_ms["p50"] == pytest.approx(25.0)
    assert r.e2e_ms["p99"] == pytest.approx(397.0)
    assert r.itl_ms == pytest.approx({"mean": 2.0, "p50": 2.0, "p99": 3.0})
    assert r.requests_per_s == 2.0
    assert r.output_tokens_per_s == 16.0
    assert (r.prompt_tokens, r.cached_tokens, r.hit_ratio) == (400, 200, 0.5)
    assert r.instances == {"a": 2, "b": 2, "unknown": 2}


def test_mix_digest_ignores_order_but_not_content() -> None:
    items = samples()
    assert build(items).mix_digest == build(items[::-1]).mix_digest
    assert build(items).mix_digest != build(items[:-1]).mix_digest


def test_empty_run_reports_without_figures() -> None:
    r = build([], elapsed=0.0)
    assert r.hit_ratio is None
    assert r.ttft_ms["p50"] is None
    assert r.requests_per_s == 0.0
    assert "hit ratio -" in render(r)


def test_table_and_json() -> None:
    r = build(samples())
    table = render(r)
    assert "4 ok, 2 failed" in table
    assert "p50 25.0" in table
    assert "hit ratio 50.0%" in table
    assert "HTTP 503: 1, TimeoutError: 1" in table
    doc = orjson.loads(orjson.dumps(r.to_dict()))
    assert doc["ttft_ms"]["p50"] == pytest.approx(25.0)
    assert doc["instances"] == {"a": 2, "b": 2, "unknown": 2}
    assert doc["hit_ratio"] == 0.5


def test_ratios_against_the_first_target() -> None:
    base = build(samples(), elapsed=2.0, target="rr")
    faster = [sample(i, ttft=0.005 * i, latency=0.1 * i, cached_tokens=80) for i in range(1, 5)]
    other = build(faster, elapsed=1.0, target="cache")
    (row,) = ratios([base, other])
    assert row["target"] == "cache"
    assert row["baseline"] == "rr"
    assert row["ttft_p50_ratio"] == pytest.approx(0.5)
    assert row["rps_ratio"] == pytest.approx(2.0)
    assert row["hit_ratio_diff_points"] == pytest.approx(30.0)
    text = render_ratios([row])
    assert "ttft_p50_ratio" in text
    assert "0.500" in text
    assert "+30.0" in text


def test_steady_figures_leave_out_the_first_requests_sent() -> None:
    """The first sight of every prefix is cold on any router: the steady window skips the
    first N requests by send time, whatever order they finished in."""
    cold = [sample(i, ttft=0.5, latency=1.0, started=float(i), cached_tokens=0) for i in (1, 2)]
    warm = [sample(i, ttft=0.01, latency=0.1, started=float(i), cached_tokens=90) for i in (3, 4)]
    r = summarize([*warm, *cold], target="t", base_url="u", info=INFO, elapsed=1.0, steady_after=2)
    assert r.steady is not None
    assert (r.steady.after, r.steady.requests, r.steady.hit_ratio) == (2, 2, 0.9)
    assert r.steady.ttft_ms["p99"] == pytest.approx(10.0)
    assert r.ttft_ms["p99"] == pytest.approx(500.0)
    assert "after 2 sent: 2 requests, hit 0.900" in render(r)
    assert build(samples()).steady is None
