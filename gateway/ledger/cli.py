"""`gateway report`: cost reports straight from the ledger database, as a table, CSV or JSON.

gateway report --from 2026-11-01 --to 2026-12-01 --group-by team --format csv
gateway report --group-by backend   # on a terminal: a table, best backend first
"""

from __future__ import annotations

import argparse
import sys

import orjson

from gateway.cli import database_arguments, database_target
from gateway.ledger.db import run_on_database
from gateway.ledger.report import cost_report, parse_group_by, parse_when


def add_arguments(parser: argparse.ArgumentParser) -> None:
    database_arguments(parser)
    parser.add_argument("--from", dest="start", type=parse_when, help="ISO date/time (UTC)")
    parser.add_argument("--to", dest="end", type=parse_when, help="ISO date/time, exclusive")
    parser.add_argument(
        "--group-by",
        type=parse_group_by,
        default=("team",),
        help="key, team, model, day or backend, or several: team,day (default: team)",
    )
    parser.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        help="default: table on a terminal, else csv",
    )


def run(args: argparse.Namespace) -> int:
    target = database_target(args)
    if target is None:
        return 2
    settings, url = target
    report = run_on_database(
        url,
        settings.database.timeout,
        lambda engine: cost_report(engine, args.start, args.end, args.group_by),
    )
    form = args.format or ("table" if sys.stdout.isatty() else "csv")
    if form == "table":
        sys.stdout.write(report.to_table())
    elif form == "csv":
        sys.stdout.write(report.to_csv())
    else:
        sys.stdout.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
