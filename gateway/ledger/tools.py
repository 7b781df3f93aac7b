"""`gateway ledger`: find calls and handle dead letters, straight from the ledger database.

gateway ledger calls --client-request-id req-123
gateway ledger dead-letters
gateway ledger replay [--id 7 --id 9] [--clean]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.cli import database_arguments, database_target
from gateway.ledger import deadletters
from gateway.ledger.db import DB_ERRORS, run_on_database, safe_url
from gateway.ledger.lookup import calls_by_client_id

Work = Callable[[AsyncEngine], Awaitable[Any]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    calls = sub.add_parser("calls", help="the calls sent with a client's x-request-id")
    calls.add_argument("--client-request-id", required=True)
    letters = sub.add_parser("dead-letters", help="rows the database refused, set aside")
    letters.add_argument("--limit", type=int, default=100)
    replay = sub.add_parser("replay", help="write dead letters to the ledger")
    replay.add_argument("--id", dest="ids", type=int, action="append",
                        help="a dead letter's id (repeatable; default: every one)")  # fmt: skip
    replay.add_argument(
        "--clean",
        action="store_true",
        help="first remove control characters, cut strings and clamp numbers to the columns",
    )
    for each in (calls, letters, replay):
        database_arguments(each)


def run(args: argparse.Namespace) -> int:
    target = database_target(args)
    if target is None:
        return 2
    settings, url = target
    try:
        return _act(args, lambda work: run_on_database(url, settings.database.timeout, work))
    except DB_ERRORS as exc:
        print(f"ledger database {safe_url(url)}: {exc}", file=sys.stderr)  # noqa: T201
        return 2


def _act(args: argparse.Namespace, on_ledger: Callable[[Work], Any]) -> int:
    if args.action == "calls":
        found = on_ledger(lambda e: calls_by_client_id(e, args.client_request_id))
        return _print({"data": found})
    if args.action == "dead-letters":
        letters = on_ledger(lambda e: deadletters.listing(e, args.limit))
        return _print({"data": [letter.to_json() for letter in letters]})
    done = on_ledger(lambda e: deadletters.replay(e, args.ids, args.clean))
    _print({"written": done.written, "refused": done.refused})
    return 1 if done.refused else 0


def _print(body: dict[str, Any]) -> int:
    sys.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
