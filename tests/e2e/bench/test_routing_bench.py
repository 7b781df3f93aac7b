"""The routing benchmark harness, shrunk: two configurations on a two-instance cluster.

Runs the real thing (a simulator process, a gateway process, the sticky proxy process,
the load generator) for a few seconds of the agents scenario, so the harness cannot rot
unnoticed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from tests.servers import ROOT


def test_two_configs_on_a_small_cluster(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.bench.routing", "--workload", "agents",
         "--configs", "gw-cache-aware", "sticky", "--instances", "2", "--duration", "3",
         "--seeds", "5", "--logs", str(tmp_path / "logs"), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    gateway, sticky = orjson.loads(out.read_bytes())
    for row in (gateway, sticky):
        assert (row["workload"], row["seed"]) == ("agents", 5)
        assert row["requests"] > 5
        assert row["ok"] == row["requests"], row["errors"]
        # Each instance's own counter: both were fresh, and together they served every call.
        assert len(row["instances"]) == 2
        assert sum(row["instances"].values()) == row["requests"]
        assert 0 < row["hit_ratio"] < 1  # the shared system prompt hits; first sights miss
        assert row["ttft_p50_ms"] <= row["ttft_p99_ms"]
        assert row["steady_p50_ms"] <= row["steady_p99_ms"]
    # Both configurations replayed the same seeded calls at the same rate.
    assert gateway["rate"] == sticky["rate"]
    assert sum(gateway["predictions"].values()) == gateway["requests"]
    assert sum(gateway["decisions"].values()) == gateway["requests"]
    assert sticky["predictions"] == {}
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["scenario", "seed", "config"]
    assert [line.split()[2] for line in lines[1:3]] == ["gw-cache-aware", "sticky"]
    # The checks are judged against the rows present: here sticky only, no peers.
    (whole,) = [line for line in lines if line.startswith("agents") and " whole " in line]
    assert whole.split()[3] in ("ok", "NO")  # hit >= 0.97 sticky
    assert lines.index("| config | agents |") > 0  # the README tables
