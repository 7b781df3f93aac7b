"""The routing benchmark harness, shrunk: two configurations on a two-instance cluster.

Runs the real thing (a simulator process, a gateway process, the sticky proxy process,
the load generator) with a handful of requests, so the harness cannot rot unnoticed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from tests.servers import ROOT

REQUESTS = 12


def test_two_configs_on_a_small_cluster(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.bench.routing", "--workload", "multi-turn",
         "--configs", "gw-cache-aware", "sticky", "--instances", "2", "--rate", "30",
         "--requests", str(REQUESTS), "--steady-after", "4",
         "--logs", str(tmp_path / "logs"), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    gateway, sticky = orjson.loads(out.read_bytes())
    for row in (gateway, sticky):
        assert row["workload"] == "multi-turn"
        assert row["ok"] == row["requests"] == REQUESTS, row["errors"]
        # Each instance's own counter: both were fresh, and together they served every call.
        assert len(row["instances"]) == 2
        assert sum(row["instances"].values()) == REQUESTS
        assert 0 < row["hit_ratio"] < 1  # the shared system prompt hits; first turns miss
        assert row["ttft_p50_ms"] <= row["ttft_p99_ms"]
        # The steady window leaves out the first 4 requests sent (mostly cold first turns).
        assert row["steady_p50_ms"] <= row["steady_p99_ms"]
        assert row["steady_hit"] > row["hit_ratio"]
    assert gateway["setup"] == "gw-cache-aware"
    assert sum(gateway["predictions"].values()) == REQUESTS
    assert sum(gateway["decisions"].values()) == REQUESTS
    assert sticky["predictions"] == {}
    head, *rows, misses = proc.stdout.splitlines()[:4]
    assert head.split()[:3] == ["workload", "config", "hit"]
    assert [line.split()[1] for line in rows] == ["gw-cache-aware", "sticky"]
    assert misses.split()[:3] == ["multi-turn", "gw-cache-aware", "inaccurate:"]
    # The targets are checked against the rows present (here: no peers, no round robin).
    checks = [line.split(maxsplit=3) for line in proc.stdout.splitlines()[4:]]
    goals = [(c[0], c[3]) for c in checks if len(c) == 4 and c[2] in ("met", "MISSED")]
    assert ("whole", "hit within 5% of sticky") in goals
    assert ("steady", "hit within 5% of sticky") in goals
    assert all(goal != "p50 <= RR p50 / 2" for _, goal in goals)
    assert proc.stdout.splitlines()[-2].startswith("| gw-cache-aware | ")  # the README table
