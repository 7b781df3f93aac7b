"""`gateway serve`: run the gateway under uvicorn (uvloop + httptools)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal, TypedDict

from gateway.api.openai import ProxyEndpoints
from gateway.app import create_app
from gateway.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    import uvicorn

CONFIG_ENV = "GATEWAY_CONFIG_FILE"
"""How worker processes learn the config file the parent was given."""
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Where prometheus_client keeps each worker's metric values (read at its import)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (see gateway.example.yaml)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8080)")
    parser.add_argument("--workers", type=int, help="worker processes (default 1)")


def run(args: argparse.Namespace) -> int:
    overrides = {k: v for k in ("host", "port", "workers") if (v := getattr(args, k)) is not None}
    try:
        settings = load_settings(args.config)
        if overrides:
            server = settings.server.model_copy(update=overrides)
            settings = settings.model_copy(update={"server": server})
    except SettingsError as exc:
        print(f"gateway: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    configure_logging(settings)
    import uvicorn

    from gateway.http_protocol import CoalescingHttpTools

    options: UvicornOptions = {
        "host": settings.server.host,
        "port": settings.server.port,
        "loop": "uvloop",
        "http": CoalescingHttpTools,
        "access_log": False,
        # No X-Forwarded-* rewriting: nothing reads the client's address, and the
        # middleware would cost every call a pass over its headers.
        "proxy_headers": False,
        "server_header": False,  # one header less to write per call, naming no version
        "log_level": settings.server.log_level,
        "lifespan": "on",
        "timeout_graceful_shutdown": math.ceil(settings.server.drain_timeout),
        "timeout_worker_healthcheck": settings.server.worker_healthcheck_timeout,
    }
    if settings.server.workers > 1:
        # Workers rebuild the app from the same config file and the same overrides.
        os.environ[CONFIG_ENV] = args.config or ""
        os.environ["GATEWAY_SERVER__PORT"] = str(settings.server.port)
        os.environ["GATEWAY_SERVER__HOST"] = settings.server.host
        # A fresh directory per run: files left by an earlier run would be counted again.
        os.environ[MULTIPROC_ENV] = metrics_dir = tempfile.mkdtemp(prefix="gateway-metrics-")
        try:
            uvicorn.run("gateway.serve:worker_app", factory=True,
                        workers=settings.server.workers, **options)  # fmt: skip
        finally:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    else:
        draining_server(uvicorn.Config(create_app(settings), **options)).run()
    return 0


class UvicornOptions(TypedDict):
    """The keyword arguments `uvicorn.run` and `uvicorn.Config` share, typed so that both
    calls are checked against uvicorn's signature."""

    host: str
    port: int
    loop: Literal["uvloop"]
    http: type[asyncio.Protocol]
    access_log: bool
    proxy_headers: bool
    server_header: bool
    log_level: str
    lifespan: Literal["on"]
    timeout_graceful_shutdown: int
    timeout_worker_healthcheck: int


def draining_server(config: uvicorn.Config) -> uvicorn.Server:
    """uvicorn's server, stopped by SIGTERM or SIGINT as uvicorn stops it (no new
    connections, calls in flight finish within server.drain_timeout, then the lifespan
    closes the services and the ledger writes what it holds), but ending with exit status 0.

    uvicorn raises the signal again once it has shut down, so the process dies by it
    (status 143 for SIGTERM) even after a clean drain, and an orchestrator or supervisor
    reads that as a crash. Here the signals only ask the server to stop."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)

    return DrainingServer(config)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def worker_app() -> ProxyEndpoints:
    settings = load_settings(os.environ.get(CONFIG_ENV) or None)
    configure_logging(settings)
    return create_app(settings)


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
