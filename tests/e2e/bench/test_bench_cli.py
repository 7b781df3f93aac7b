"""`gateway bench` as a user runs it: a subprocess against a real simulator subprocess.

Each run is bounded by --requests or --duration and takes a second or two.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.servers import ROOT, consecutive_free_ports, gateway_process

# Small prompts and answers keep each run to about a second on the default sim timings.
SMALL = ["--prefix-words", "300", "--max-tokens", "8", "--message-words", "16"]


@contextlib.contextmanager
def two_instances() -> Iterator[list[str]]:
    """Two identical, independent simulated instances (own caches) in one process."""
    with gateway_process("sim", "--instances", "2", port=consecutive_free_ports(2)) as base:
        port = int(base.rsplit(":", 1)[1])
        yield [f"{base}/v1", f"http://127.0.0.1:{port + 1}/v1"]


@pytest.fixture(scope="module")
def sims() -> Iterator[list[str]]:
    """Shared by the tests whose prompts cannot meet (salted, tagged or seeded apart)."""
    with two_instances() as urls:
        yield urls


@pytest.fixture
def fresh_sims() -> Iterator[list[str]]:
    with two_instances() as urls:
        yield urls


def bench(*args: str, json_path: Path) -> tuple[subprocess.CompletedProcess[str], Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", *args, "--json", str(json_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, orjson.loads(json_path.read_bytes())


def test_run_reports_table_and_json(sims: list[str], tmp_path: Path) -> None:
    proc, report = bench("run", "--base-url", sims[0], "--workload", "shared-prefix",
                         "--groups", "4", "--requests", "32", "--concurrency", "4",
                         "--salt", "run-table ", *SMALL, json_path=tmp_path / "r.json")  # fmt: skip
    assert (report["requests"], report["ok"], report["errors"]) == (32, 32, {})
    assert report["model"] == "sim-model"
    instance = f"sim-{sims[0].split(':')[2].removesuffix('/v1')}"
    assert report["instances"] == {instance: 32}
    # 4 groups of ~300-token prompts: all but the first few requests of each group hit.
    assert report["hit_ratio"] > 0.5
    assert report["output_tokens"] == 32 * 8
    assert 0 < report["ttft_ms"]["p50"] <= report["ttft_ms"]["p90"] <= report["ttft_ms"]["p99"]
    assert report["itl_ms"]["mean"] > 0
    assert "32 sent, 32 ok, 0 failed" in proc.stdout
    assert "hit ratio" in proc.stdout


def test_two_runs_of_one_seed_give_the_same_mix_and_hit_ratio(
    fresh_sims: list[str], tmp_path: Path
) -> None:
    """Same seed on two fresh, identical instances: same requests, hit ratio within 2 points."""
    reports = [
        bench("run", "--base-url", url, "--workload", "mixed", "--seed", "11",
              "--requests", "48", "--concurrency", "8", *SMALL,
              json_path=tmp_path / f"{i}.json")[1]
        for i, url in enumerate(fresh_sims)
    ]  # fmt: skip
    first, second = reports
    assert first["ok"] == second["ok"] == 48
    assert first["mix_digest"] == second["mix_digest"]
    assert first["prompt_tokens"] == second["prompt_tokens"]
    assert first["hit_ratio"] > 0.3
    assert abs(first["hit_ratio"] - second["hit_ratio"]) <= 0.02


def test_compare_runs_both_targets_at_once_with_ratios(sims: list[str], tmp_path: Path) -> None:
    proc, doc = bench("compare", "--target", f"a={sims[0]}", "--target", f"b={sims[1]}",
                      "--workload", "multi-turn", "--conversations", "4", "--turns", "3",
                      "--rate", "20", "--session-header", *SMALL,
                      json_path=tmp_path / "c.json")  # fmt: skip
    a, b = doc["reports"]
    assert (a["target"], b["target"]) == ("a", "b")
    assert a["requests"] == b["requests"] == 12
    assert a["mix_digest"] == b["mix_digest"]
    # later turns resend their history, which the instance still holds
    assert a["hit_ratio"] > 0.2
    (row,) = doc["ratios"]
    assert row["baseline"] == "a"
    assert row["ttft_p50_ratio"] > 0
    assert "hit_ratio_diff_points" in proc.stdout


def test_duration_bounds_an_open_loop_run(sims: list[str], tmp_path: Path) -> None:
    t0 = time.monotonic()
    _, report = bench("run", "--base-url", sims[0], "--workload", "tiny", "--rate", "40",
                      "--duration", "1", json_path=tmp_path / "d.json")  # fmt: skip
    assert time.monotonic() - t0 < 60  # ends by its duration (a busy start takes seconds)
    assert 10 <= report["requests"] <= 100
    assert report["ok"] == report["requests"]
    assert report["load"] == "rate=40/s"


def test_unreachable_target_fails_with_errors_by_kind(tmp_path: Path) -> None:
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "run", "--base-url", url, "--model", "m",
         "--requests", "3", "--workload", "tiny", "--json", str(tmp_path / "e.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    report = orjson.loads((tmp_path / "e.json").read_bytes())
    assert report["errors"] == {"ClientConnectorError": 3}
    assert report["instances"] == {"unknown": 3}
