"""Ledger benchmarks: writer throughput into Postgres, and cost reports over many rows.

    python -m gateway.ledger.bench --database-url postgresql://127.0.0.1:5432/test

Everything happens in a scratch database created on that server and dropped at the end.
The writer runs with the ledger's rollup triggers on and off in turn (what keeping the
rollup costs the writer); the report with the scorecard is set against the plain cost
report over the rows, each round both in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import asyncpg
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.flow import Call, Principal, Request, Route, Usage
from gateway.ledger.db import make_engine
from gateway.ledger.migrate import upgrade
from gateway.ledger.report import GroupBy, cost_report, parse_when, report_query
from gateway.ledger.rows import Row
from gateway.ledger.service import Ledger
from gateway.settings import Settings, load_settings

# 10M rows spread over 90 days, 50 teams, 500 keys, 4 models, 8 backends; each row's
# tokens vary with its number, and its costs are those tokens at one fixed price ($0.15,
# $0.075 and $0.60 per million: 1500, 750 and 6000 units of 1e-10 USD per token). TTFT
# spreads over 20-400 ms and end-to-end time over up to 4.8 s, as real calls' do (the
# scorecard's percentiles cost more the more distinct durations they rank); one call in
# 97 is refused, one in 211 fails.
SYNTHETIC = """
INSERT INTO ledger (request_id, ts, key_id, team, model, backend, endpoint, stream, status,
    error_type, decision, served_by, disconnected, estimated, prompt_tokens, input_tokens,
    cached_tokens, cache_write_tokens, completion_tokens, predicted_cached_tokens, price_id,
    cost_input, cost_cached_input, cost_cache_write, cost_output, cost_total,
    cost_without_cache, ttft_s, latency_s)
SELECT 'bench-' || g, ts, 'key-' || g % 500, 'team-' || g % 50, 'model-' || g % 4,
    'b' || g % 8, 'chat', g % 2 = 0,
    CASE WHEN g % 97 = 0 THEN 429 WHEN g % 211 = 0 THEN 502 ELSE 200 END,
    NULL, 'hit', 'upstream', false, false,
    p, p - c, c, 0, o, c, NULL,
    (p - c) * 1500, c * 750, 0, o * 6000, (p - c) * 1500 + c * 750 + o * 6000, p * 1500 + o * 6000,
    t, t + o * (0.004 + (g % 8) * 0.001)
FROM (
    SELECT g, timestamptz '2026-09-01' + g * ($2::float8 / $1) * interval '1 second' AS ts,
           200 + (g * 7919) % 3000 AS p, ((g * 7919) % 3000 / 16) * 8 AS c, 1 + g % 400 AS o,
           0.02 + (g % 8) * 0.01 + ((g * 104729) % 1000003) * 3e-7 AS t
    FROM generate_series(1, $1::bigint) AS g
) AS s
"""
INDEXES = ("ix_ledger_ts", "ix_ledger_team_ts", "ix_ledger_key_ts", "ix_ledger_model_ts")


@asynccontextmanager
async def scratch_database(server_url: str) -> AsyncIterator[str]:
    name = f"gw_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url, timeout=10)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        base, _, _ = server_url.rpartition("/")
        yield f"{base}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def bench_settings(url: str, spool: Path, batch_size: int) -> Settings:
    price = {"input": "0.15", "cached_input": "0.075", "output": "0.60"}
    model = {"name": "bench", "backends": [{"url": "http://127.0.0.1:9"}], "price": price}
    return load_settings(
        database={"url": url},
        ledger={"spool_dir": str(spool), "batch_size": batch_size},
        models=[model],
    )


def synthetic_call(i: int) -> Call:
    """A call timed as SYNTHETIC's rows are: its batch feeds the rollup as many counted
    durations as real calls' would."""
    call = Call(id=f"w-{i}", path="/v1/chat/completions")
    call.principal = Principal(key_id=f"key-{i % 500}", team=f"team-{i % 50}")
    call.request = Request(endpoint="chat", model="bench", body={}, stream=i % 2 == 0)
    call.route = Route(backend=f"b{i % 8}", decision="hit", predicted_cached_tokens=512)
    ttft = 0.02 + (i % 8) * 0.01 + ((i * 104729) % 1000003) * 3e-7
    call.first_byte_at = call.received_at + ttft
    call.done_at = call.first_byte_at + (1 + i % 400) * (0.004 + (i % 8) * 0.001)
    call.usage = Usage(prompt_tokens=1024, cached_tokens=512, completion_tokens=200)
    return call


@dataclass(frozen=True, slots=True)
class WriterRun:
    rows_per_s: float
    us_here: float
    """CPU per row in this process, and in the Postgres backends (0: not local)."""
    us_postgres: float

    def summary(self) -> str:
        cpu = f"; CPU {self.us_here:.1f} us/row here + {self.us_postgres:.1f} in Postgres"
        return f"{self.rows_per_s:,.0f} rows/s committed" + (cpu if self.us_postgres else "")


async def writer_throughput(url: str, rows: int, batch_size: int) -> WriterRun:
    """Record calls through Ledger.record as fast as possible; time until all are committed.

    Besides wall time it measures the CPU both sides spent (this process, and the Postgres
    backends serving the scratch database when the server runs on this machine), because
    on a shared, busy machine the wall time mostly measures the neighbours.
    """
    done, written = asyncio.Event(), [0]

    def count(batch: Sequence[Row]) -> None:
        written[0] += len(batch)
        if written[0] >= rows:
            done.set()

    with tempfile.TemporaryDirectory() as spool:
        settings = bench_settings(url, Path(spool), batch_size)
        ledger = Ledger(settings, CollectorRegistry(), on_written=count)
        await ledger.start()
        calls = [synthetic_call(i) for i in range(rows)]
        pg_before = await backend_cpu(url)
        t0, cpu0 = time.perf_counter(), time.process_time()
        for start in range(0, rows, 1000):
            for call in calls[start : start + 1000]:
                ledger.record(call, ledger.price(call))
            await asyncio.sleep(0)  # let the writer run, as request handling would
        recorded = time.perf_counter() - t0
        await done.wait()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        pg_cpu = await backend_cpu(url) - pg_before
        await ledger.aclose()
    say(f"writer: {rows} rows, batch {batch_size}, {elapsed:.2f} s wall; record() alone "
        f"{recorded / rows * 1e6:.1f} us/call")  # fmt: skip
    return WriterRun(rows / elapsed, cpu / rows * 1e6, pg_cpu / rows * 1e6)


async def writer_rollup_cost(url: str, rows: int, batch_size: int, rounds: int) -> None:
    """The writer with the rollup's triggers on and off, in turn (which goes first
    alternates): per round the ratios of rows/s and of Postgres CPU per row, and their
    medians."""
    speed, cpu = [], []
    for i in range(rounds):
        runs = {}
        for on in (True, False) if i % 2 == 0 else (False, True):
            await _sql(url, f"ALTER TABLE ledger {'ENABLE' if on else 'DISABLE'} TRIGGER USER")
            runs[on] = await writer_throughput(url, rows, batch_size)
            await _sql(url, "ALTER TABLE ledger ENABLE TRIGGER USER; TRUNCATE ledger")
            say(f"writer: rollup {'on ' if on else 'off'}: {runs[on].summary()}")
        speed.append(runs[True].rows_per_s / runs[False].rows_per_s)
        if runs[False].us_postgres:
            cpu.append(runs[True].us_postgres / runs[False].us_postgres)
    say(f"writer: rollup on/off, medians of {rounds}: rows/s {statistics.median(speed):.3f}x "
        f"(rounds {', '.join(f'{r:.3f}' for r in speed)})"
        + (f"; Postgres CPU per row {statistics.median(cpu):.3f}x" if cpu else ""))  # fmt: skip


async def _sql(url: str, statements: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute(statements, timeout=None)
    finally:
        await conn.close()


async def backend_cpu(url: str) -> float:
    """CPU seconds used so far by the Postgres backends on url's database (0: not local)."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        pids = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    return proc_cpu([pid for (pid,) in pids])


def proc_cpu(pids: list[int]) -> float:
    """CPU seconds of local processes from /proc; 0 if any is not visible here."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


async def report_speed(url: str, rows: int, days: int) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        for index in INDEXES:
            await conn.execute(f"DROP INDEX {index}")
        t0 = time.perf_counter()
        await conn.execute(SYNTHETIC, rows, days * 86400, timeout=None)
        await conn.execute(
            "CREATE INDEX ix_ledger_ts ON ledger (ts);"
            "CREATE INDEX ix_ledger_team_ts ON ledger (team, ts);"
            "CREATE INDEX ix_ledger_key_ts ON ledger (key_id, ts);"
            "CREATE INDEX ix_ledger_model_ts ON ledger (model, ts);",
            timeout=None,
        )
        await conn.execute("VACUUM ANALYZE ledger", timeout=None)
        say(f"report: generated {rows:,} rows with indexes in {time.perf_counter() - t0:.0f} s")
    finally:
        await conn.close()
    engine = make_engine(url, timeout=600)
    october = (parse_when("2026-10-01"), parse_when("2026-11-01"))
    ragged = (parse_when("2026-10-01T00:30"), parse_when("2026-11-01T12:15"))
    cases: list[tuple[tuple[GroupBy, ...], tuple[datetime, datetime] | None]] = [
        (("team", "day"), None), (("team",), None), (("day",), None), (("team",), october),
        (("backend", "day"), ragged),
    ]  # fmt: skip
    try:
        await scorecard_cost(engine, ("backend", "day"), rounds=3)
        for group_by, window in cases:
            start, end = window or (None, None)
            t0 = time.perf_counter()
            report = await cost_report(engine, start, end, group_by)
            elapsed = time.perf_counter() - t0
            period = f"{start:%m-%d %H:%M} to {end:%m-%d %H:%M}" if start and end else "all rows"
            say(f"report: group by {','.join(group_by)} over {period}: "
                f"{report.totals.requests:,} rows -> {len(report.lines):,} lines "
                f"in {elapsed:.2f} s; total ${report.totals.cost_total}")  # fmt: skip
    finally:
        await engine.dispose()


async def scorecard_cost(engine: AsyncEngine, group_by: tuple[GroupBy, ...], rounds: int) -> None:
    """The whole report (sums and scorecard, from the rollup where it holds the groupings)
    against the plain cost report, its sums over the rows, alternated so that both meet
    the same neighbours: the medians and their ratio."""
    plain, whole = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        async with engine.connect() as conn:
            await conn.execute(report_query("postgresql", None, None, group_by))
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await cost_report(engine, None, None, group_by)
        whole.append(time.perf_counter() - t0)
    p, w = statistics.median(plain), statistics.median(whole)
    say(f"report: group by {','.join(group_by)}: plain (sums over the rows) {p:.2f} s, with "
        f"the scorecard {w:.2f} s ({w / p:.2f}x; medians of {rounds})")  # fmt: skip


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(args: argparse.Namespace) -> None:
    async with scratch_database(args.database_url) as url:
        engine = make_engine(url)
        try:
            await upgrade(engine)
        finally:
            await engine.dispose()
        if args.writer_rows:
            await writer_rollup_cost(url, args.writer_rows, args.batch_size, args.rounds)
        if args.report_rows:
            await report_speed(url, args.report_rows, args.days)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gateway.ledger.bench", description=__doc__)
    parser.add_argument("--database-url", required=True, help="a Postgres server (any db)")
    parser.add_argument("--writer-rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4, help="writer rounds, rollup on and off")
    parser.add_argument("--report-rows", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=90)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args(None)))
