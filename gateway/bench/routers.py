"""The routers under test: each configuration's process in front of a simulated cluster.

The gateway with one of its policies, the ideal conversation-sticky proxy
(:mod:`gateway.bench.sticky`), one instance alone (``oracle``), and the Rust routers
``sglang-router`` and ``vllm-router`` (installed by ``deploy/bench/peers.sh``) with their
defaults and with tuned thresholds, and vllm-router's consistent hash of the session key.
Each runs as its own process with its log kept, and stops when its context exits.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import sys
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import yaml

from gateway.bench import cluster

SIM_MODEL = "sim-model"
ROUTERS = Path("/work/peers/routers/bin")
"""Where deploy/bench/peers.sh installs the peer routers (--routers overrides it; a router
missing there is looked up on PATH)."""

Router = Literal["gateway", "sglang-router", "vllm-router", "sticky", "none"]
TUNED = ("--balance-abs-threshold", "4", "--balance-rel-threshold", "1.2",
         "--cache-threshold", "0.5")  # fmt: skip
"""Thresholds tuned for this cluster: balance at a gap of 4 requests (not 64), and a
match must cover half the prompt (not 30%), so a shared system prompt alone is no match."""


@dataclass(frozen=True, slots=True)
class Setup:
    """One router configuration in front of the cluster."""

    name: str
    router: Router
    args: tuple[str, ...] = ()
    """The gateway's routing policy, or the Rust router's command-line options."""
    session_header: bool = False
    """Send each conversation's id as x-session-id."""
    single: bool = False
    """One instance with unlimited cache instead of the cluster."""


SETUPS = {
    s.name: s
    for s in (
        Setup("gw-cache-aware", "gateway", ("cache_aware",)),
        Setup("gw-least-loaded", "gateway", ("least_loaded",)),
        Setup("gw-round-robin", "gateway", ("round_robin",)),
        Setup("sticky", "sticky", session_header=True),
        Setup("oracle", "none", single=True),
        Setup("sglang-cache-aware", "sglang-router", ("--policy", "cache_aware")),
        Setup("sglang-cache-aware-tuned", "sglang-router", ("--policy", "cache_aware", *TUNED)),
        Setup("vllm-cache-aware", "vllm-router", ("--policy", "cache_aware")),
        Setup("vllm-cache-aware-tuned", "vllm-router", ("--policy", "cache_aware", *TUNED)),
        Setup("vllm-consistent-hash", "vllm-router", ("--policy", "consistent_hash"), True),
    )
}

PEERS = ("vllm-consistent-hash", "sglang-cache-aware", "sglang-cache-aware-tuned",
         "vllm-cache-aware", "vllm-cache-aware-tuned")  # fmt: skip
"""The other routers a deployment could choose instead of the gateway."""
ROUND_ROBIN, STICKY, SUBJECT = "gw-round-robin", "sticky", "gw-cache-aware"
ZOO_SETUPS = (SUBJECT, ROUND_ROBIN, STICKY, *PEERS)
"""What the zoo compares by default: the gateway, its baselines and every peer."""


@dataclass(frozen=True, slots=True)
class Front:
    """What the load generator talks to, and where the gateway keeps its evidence."""

    url: str
    gateway: bool = False
    ledger: Path | None = None


@contextlib.asynccontextmanager
async def front_of(
    setup: Setup,
    urls: list[str],
    logs: Path,
    routers: Path,
    settings: Mapping[str, Mapping[str, Any]],
    model: str = SIM_MODEL,
) -> AsyncIterator[Front]:
    """Start the setup's router in front of urls, which serve ``model``; ``settings``:
    extra gateway settings by section (``{"routing": {...}}``)."""
    if setup.router == "none":
        yield Front(urls[0])
        return
    port = cluster.free_ports(1)
    url = f"http://127.0.0.1:{port}"
    if setup.router == "gateway":
        config, ledger = gateway_config(setup.args[0], urls, port, logs, settings, model)
        cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
        async with cluster.process("gateway", cmd, f"{url}/health", logs):
            yield Front(url, gateway=True, ledger=ledger)
        return
    if setup.router == "sticky":
        backends = [a for u in urls for a in ("--backend", u)]
        cmd = [sys.executable, "-m", "gateway.bench.sticky", "--port", str(port), *backends]
    else:
        cmd = rust_router(setup, urls, port, routers)
    async with cluster.process(setup.router, cmd, f"{url}/v1/models", logs):
        yield Front(url)


def rust_router(setup: Setup, urls: list[str], port: int, routers: Path) -> list[str]:
    """The command line; its metrics exporter gets a free port of its own (both routers
    default to 29000, so a second router on the machine would fail to start)."""
    sglang = setup.router == "sglang-router"
    launch, level = (["launch"], "warn") if sglang else ([], "warning")
    exe = routers / setup.router
    if not exe.exists():
        exe = Path(shutil.which(setup.router) or exe)
    return [str(exe), *launch, "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-port", str(cluster.free_ports(1)),
            "--worker-urls", *urls, "--worker-startup-check-interval", "1",
            "--log-level", level, *setup.args]  # fmt: skip


def gateway_config(
    policy: str,
    urls: list[str],
    port: int,
    logs: Path,
    settings: Mapping[str, Mapping[str, Any]],
    model: str,
) -> tuple[Path, Path]:
    """A config file for `gateway serve`: the cluster as one model, the ledger in logs."""
    ledger = logs / "ledger.db"
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "models": [
            {
                "name": model,
                "backends": [{"url": u, "name": "sim-" + u.rsplit(":", 1)[1]} for u in urls],
            }
        ],
        "routing": {"policy": policy},
        "database": {"url": f"sqlite:///{ledger}"},
        "ledger": {"spool_dir": str(logs / "spool")},
    }
    for section, values in settings.items():
        config[section] = {**config.get(section, {}), **values}
    path = logs / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, ledger


async def scrape(url: str) -> str:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"{url}/metrics") as resp,
    ):
        return await resp.text()


def by_label(metrics: str, metric: str, label: str) -> dict[str, int]:
    out: Counter[str] = Counter()
    for labels, value in cluster.samples(metrics, metric):
        for pair in labels.split(","):
            key, _, quoted = pair.partition("=")
            if key.strip() == label:
                out[quoted.strip('"')] += int(value)
    return dict(sorted(out.items()))


def prediction_misses(ledger: Path) -> dict[str, int]:
    """Calls whose predicted cached share was off by more than 0.1, by decision and kind.

    Kinds: ``evicted`` (a hit predicted, nothing cached), ``unseen`` (nothing predicted,
    something cached), ``over``/``under`` (partly). The ledger has the prediction in
    gateway tokens and the prompt in backend tokens, so the share here divides by the
    backend's count: close to the metric's, not exactly it (the metric is the figure).
    """
    if not ledger.exists():
        return {}
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        rows = db.execute(
            "SELECT decision, predicted_cached_tokens, cached_tokens, prompt_tokens FROM ledger "
            "WHERE status = 200 AND NOT estimated AND prompt_tokens > 0"
        ).fetchall()
    out: Counter[str] = Counter()
    for decision, predicted, cached, prompt in rows:
        if abs(predicted - cached) / prompt > 0.1:
            out[f"{decision}:{miss_kind(predicted, cached)}"] += 1
    return dict(sorted(out.items()))


def miss_kind(predicted: int, cached: int) -> str:
    if not cached:
        return "evicted"
    if not predicted:
        return "unseen"
    return "over" if predicted > cached else "under"
