"""`gateway keys`: issue, list and disable API keys and create teams, straight in the database.

gateway keys teams create search --rpm 600 --tpm 200000 --budget 50 --budget-period day
gateway keys create --team search --models sim-model --rpm 60 --budget 5 --expires 2027-01-01
gateway keys list [--team search]
gateway keys disable key_0123456789abcdef

The secret of a new key is printed once and stored nowhere: only its HMAC under
auth.pepper is kept, so run this with the gateway's own config (or GATEWAY_AUTH__PEPPER).
A disabled key stops working within auth.cache_ttl seconds on every running gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.cli import database_arguments, database_target
from gateway.keys import store
from gateway.keys.specs import KeySpec, TeamSpec
from gateway.ledger.db import make_engine
from gateway.ledger.migrate import SchemaError, ensure_schema
from gateway.settings import Settings

Action = Callable[[AsyncEngine, Settings, argparse.Namespace], Awaitable[Any]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    database_arguments(common, "YAML settings file (for database.url, auth.pepper)")
    sub = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    create = sub.add_parser("create", parents=[common], help="issue a key (printed once)")
    create.add_argument("--team", required=True)
    create.add_argument("--name", help="a label for people")
    create.add_argument("--models", nargs="+", help="models the key may call (default: all)")
    _limits(create)
    create.add_argument("--expires", help="ISO date or time (UTC unless given)")
    create.set_defaults(_action=_create_key)

    listing = sub.add_parser("list", parents=[common], help="list keys (never their secrets)")
    listing.add_argument("--team")
    listing.set_defaults(_action=_list_keys)

    disable = sub.add_parser("disable", parents=[common], help="disable a key by its id")
    disable.add_argument("key_id", metavar="ID")
    disable.set_defaults(_action=_disable_key)

    teams = sub.add_parser("teams", help="create and list teams").add_subparsers(
        dest="teams_command", required=True, metavar="ACTION"
    )
    team = teams.add_parser("create", parents=[common], help="create a team")
    team.add_argument("name", metavar="NAME")
    _limits(team)
    team.set_defaults(_action=_create_team)
    teams.add_parser("list", parents=[common], help="list teams").set_defaults(_action=_list_teams)


def _limits(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rpm", type=int, help="requests per minute")
    parser.add_argument("--tpm", type=int, help="tokens per minute")
    parser.add_argument("--budget", type=Decimal, help="USD per budget period")
    parser.add_argument("--budget-period", choices=("day", "month"), default="month")


def run(args: argparse.Namespace) -> int:
    target = database_target(args)
    if target is None:
        return 2
    settings, url = target
    try:
        result = asyncio.run(_with_engine(url, settings, args))
    except ValidationError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 2
    except (store.UnknownTeam, store.TeamExists, LookupError, SchemaError) as exc:
        print(_reason(exc), file=sys.stderr)
        return 1
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0


async def _with_engine(url: str, settings: Settings, args: argparse.Namespace) -> Any:
    engine = make_engine(url, settings.database.timeout)
    try:
        auto = settings.database.auto_migrate
        await ensure_schema(engine, engine.dialect.name == "sqlite" if auto is None else auto)
        action: Action = args._action
        return await action(engine, settings, args)
    finally:
        await engine.dispose()


async def _create_team(engine: AsyncEngine, _s: Settings, args: argparse.Namespace) -> Any:
    spec = TeamSpec(name=args.name, **_limit_values(args))
    return (await store.create_team(engine, spec, datetime.now(UTC))).as_dict()


async def _list_teams(engine: AsyncEngine, _s: Settings, _a: argparse.Namespace) -> Any:
    return [t.as_dict() for t in await store.list_teams(engine)]


async def _create_key(engine: AsyncEngine, settings: Settings, args: argparse.Namespace) -> Any:
    spec = KeySpec(
        team=args.team,
        name=args.name,
        models=args.models,
        expires_at=args.expires,
        **_limit_values(args),
    )
    key, secret = await store.create_key(engine, spec, settings.auth.pepper, datetime.now(UTC))
    print("store this key now: it cannot be shown again", file=sys.stderr)
    return {**key.as_dict(), "key": secret}


async def _list_keys(engine: AsyncEngine, _s: Settings, args: argparse.Namespace) -> Any:
    return [k.as_dict() for k in await store.list_keys(engine, args.team)]


async def _disable_key(engine: AsyncEngine, _s: Settings, args: argparse.Namespace) -> Any:
    key = await store.disable_key(engine, args.key_id, datetime.now(UTC))
    if key is None:
        raise LookupError(f"no key {args.key_id!r}")
    return key.as_dict()


def _limit_values(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "rpm": args.rpm,
        "tpm": args.tpm,
        "budget_usd": args.budget,
        "budget_period": args.budget_period,
    }


def _reason(exc: Exception) -> str:
    if isinstance(exc, store.UnknownTeam):
        return f"no team {exc}: create it with `gateway keys teams create {exc}`"
    if isinstance(exc, store.TeamExists):
        return f"team {exc} already exists"
    return str(exc.args[0] if exc.args else exc)
