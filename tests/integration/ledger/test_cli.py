"""`gateway report` prints the same exact figures as the API, as CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.flow import Usage
from gateway.ledger import Ledger
from tests.integration.ledger.factory import ledger_settings, make_call, record
from tests.servers import ROOT

PRICES = {"alpha": {"input": "0.15", "cached_input": "0.075", "output": "0.60"}}


def report(url: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "report", "--database-url", url, *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_report_command(pg_db_url: str, tmp_path: Path) -> None:
    ledger = Ledger(ledger_settings(pg_db_url, tmp_path / "spool", PRICES), CollectorRegistry())
    await ledger.start()
    first = make_call("alpha", usage=Usage(1000, 400, 100))
    record(ledger, first)
    record(ledger, make_call("alpha", team="team-b", usage=Usage(2000, 0, 10)))
    record(ledger, make_call("alpha", team="team-b", received_wall=946684800.0))  # 2000-01-01
    await ledger.aclose()

    table = list(csv.DictReader(io.StringIO(report(
        pg_db_url, "--from", "2020-01-01", "--to", "2100-01-01", "--group-by", "team",
    ))))  # fmt: skip
    assert [(r["team"], r["requests"], r["cached_tokens"], r["cost_total"], r["savings"])
            for r in table] == [
        ("team-a", "1", "400", "0.0001800000", "0.0000300000"),
        ("team-b", "1", "0", "0.0003060000", "0.0000000000"),
        ("TOTAL", "2", "400", "0.0004860000", "0.0000300000"),
    ]  # fmt: skip
    by_day = json.loads(report(pg_db_url, "--group-by", "day", "--format", "json"))
    today = datetime.fromtimestamp(first.received_wall, UTC).date().isoformat()
    assert [(r["day"], r["requests"]) for r in by_day["rows"]] == [
        ("2000-01-01", 1), (today, 2)
    ]  # fmt: skip
    assert by_day["totals"]["requests"] == 3
    team_day = report(pg_db_url, "--group-by", "team,day").splitlines()
    assert team_day[0].startswith("team,day,requests,refused,failed,prompt_tokens,")
    # Then the scorecard: 400 of 1000 cached, 0.00003 saved of 0.00021, 0.00012 for 1000
    # prompt tokens, 0.00006 for 100 output; no TTFT (not streamed), 500 ms end to end.
    assert team_day[1:2] == [
        f"team-a,{today},1,0,0,1000,600,400,0,100,0.0000900000,0.0000300000,0.0000000000,"
        "0.0000600000,0.0001800000,0.0002100000,0.0000300000,"
        "0.4000,0.1429,0.1200000000,0.6000000000,,,500"
    ]
    assert team_day[-1].startswith("TOTAL,,3,0,0,3000,")
    lines = report(pg_db_url, "--group-by", "team", "--format", "table").splitlines()
    assert lines[0].split()[:4] == ["team", "served", "refused", "failed"]
    assert lines[1].split()[-4:] == ["0.6000000000", "-", "-", "500"]
    assert [line.split()[0] for line in lines[1:]] == ["team-a", "team-b", "TOTAL"]
