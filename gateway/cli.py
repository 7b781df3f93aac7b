"""The `gateway` console script.

Each subcommand lives in its own module, exposing ``add_arguments(parser)`` and
``run(args) -> int``; it is imported only when invoked, so `gateway sim` does not pay
for the gateway's imports and vice versa.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.settings import Settings

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.serve", "run the gateway"),
    "sim": ("gateway.sim.cli", "run the vLLM-compatible simulator"),
    "bench": ("gateway.bench.cli", "replay a workload against OpenAI-compatible URLs"),
    "report": ("gateway.ledger.cli", "cost reports from the ledger"),
    "ledger": ("gateway.ledger.tools", "find calls; list and replay dead letters"),
    "keys": ("gateway.keys.cli", "create, list and disable API keys"),
    "migrate": ("gateway.ledger.migrate", "apply the database migrations"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Build the parser, importing only the subcommand named in argv (if any)."""
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text)
        if name == wanted:
            mod = importlib.import_module(module)
            mod.add_arguments(sp)
            sp.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return int(args._run(args) or 0)


def database_arguments(parser: argparse.ArgumentParser, config_help: str | None = None) -> None:
    """--config and --database-url, for the subcommands that work on the ledger database."""
    parser.add_argument("--config", help=config_help or "YAML settings file")
    parser.add_argument("--database-url", help="default: the settings' database.url")


def database_target(args: argparse.Namespace) -> tuple[Settings, str] | None:
    """The settings and the database URL those arguments name; None (reported) if bad."""
    from gateway.settings import SettingsError, load_settings

    try:
        settings = load_settings(args.config)
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return None
    return settings, args.database_url or settings.database.url
