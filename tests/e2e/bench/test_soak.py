"""`python -m gateway.bench.soak`, shortened: the production shape end to end (Postgres,
Redis, keys, wrk), with heap reports; the README's million-call figures come from the
full command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def test_a_short_soak_serves_every_call_and_asks_a_new_question_each_time(
    tmp_path: Path, pg_server_url: str, redis_server_url: str
) -> None:
    heap = tmp_path / "heap"
    out = subprocess.run(
        [sys.executable, "-m", "gateway.bench.soak", "--calls", "600", "--warmup", "200",
         "--heap", str(heap), "--heap-every", "200", "--round", "3", "--connections", "4",
         "--keys", "2", "--max-minutes", "4", "--database-url", pg_server_url,
         "--redis-url", redis_server_url],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "gateway (0 non-2xx)" in out.stdout
    row = re.search(r"^\| gateway \| ([\d,]+) \|", out.stdout, re.M)
    assert row is not None, out.stdout
    calls = int(row.group(1).replace(",", ""))
    assert calls >= 600
    reports = sorted(heap.glob("*.json"))
    assert len(reports) >= 2
    last = json.loads(reports[-1].read_text())
    assert "error" not in last
    # Every call's last question is new text, so the piece cache holds one per call at
    # least (a run asking the same questions each round would hold one per round's call).
    assert last["containers"]["services.prefix._pieces"] >= calls
    assert last["gc_objects"] > 0
    assert "heap 001 ->" in out.stdout
