"""`gateway serve --workers 2`: every scrape shows the totals, whichever worker answers."""

from __future__ import annotations

import os
from pathlib import Path

from tests.e2e.conftest import MODEL, write_config
from tests.e2e.metrics.traffic import run_mix, scrape
from tests.servers import gateway_process

SCRAPES = 12


def test_two_workers_report_exact_totals_on_every_scrape(sims: list[str], tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "gateway.yaml", sims)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}  # where the parent makes the metrics directory
    with gateway_process("serve", "--config", str(cfg), "--workers", "2", env=env) as url:
        [metrics_dir] = tmp.glob("gateway-metrics-*")
        exp = run_mix(url, rounds=3)
        previous = None
        for _ in range(SCRAPES):
            got = scrape(url)
            assert got.total("gateway_requests_total") == sum(exp.requests.values())
            assert got.total("gateway_requests_total", status="200") == exp.dispatched
            assert got.total("gateway_tokens_total", kind="prompt", model=MODEL) == exp.prompt
            assert got.total("gateway_tokens_total", kind="cached", model=MODEL) == exp.cached
            assert (
                got.total("gateway_tokens_total", kind="completion", model=MODEL) == exp.completion
            )
            assert got.total("gateway_time_to_first_token_seconds_count") == exp.streamed
            assert got.total("gateway_backend_in_flight_requests") == 0
            # Health is merged, not listed once per worker.
            assert sorted(got.values("gateway_backend_healthy").values()) == [1.0, 1.0]
            if previous is not None:
                assert got.values("gateway_requests_total") == previous
            previous = got.values("gateway_requests_total")
        # Both workers wrote their own files there.
        pids = {p.stem.rpartition("_")[2] for p in metrics_dir.glob("counter_*.db")}
        assert len(pids) == 2, os.listdir(metrics_dir)
    assert not metrics_dir.exists(), "the parent must remove its metrics directory"
