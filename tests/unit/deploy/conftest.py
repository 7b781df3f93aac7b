"""The deploy/ files as data, and the metric names the gateway and vLLM really export."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.ledger.metrics import LedgerMetrics
from gateway.limits.metrics import LimitMetrics
from gateway.metrics import GatewayMetrics
from gateway.sim.config import SimConfig
from gateway.sim.engine import Engine
from gateway.sim.metrics import registry_for, render

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "gateway.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "datasources.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
VLLM_NAMES = ROOT / "tests" / "vllm" / "fixtures" / "metric_names.txt"
"""Every metric name a real vLLM server exported (recorded by tests/vllm), if present."""

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def family_samples(name: str, kind: str) -> set[str]:
    """The sample names a family of this type shows in the text format."""
    if kind == "unknown":
        return {name}
    return {name + suffix for suffix in SUFFIXES[kind]}


def gateway_names() -> set[str]:
    """Every series name the gateway's /metrics can carry (its own, the ledger's, the limits')."""
    registry = CollectorRegistry()
    GatewayMetrics(registry)
    LedgerMetrics(registry)
    LimitMetrics(registry)
    return {n for f in registry.collect() for n in family_samples(f.name, f.type)}


def simulator_names() -> set[str]:
    """Every series name the simulator's /metrics shows (vLLM's names)."""

    async def exposition() -> str:  # the engine binds to the running loop
        return render(registry_for(Engine(SimConfig()))).decode()

    text = asyncio.run(exposition())
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def vllm_names() -> set[str]:
    if not VLLM_NAMES.is_file():
        return set()
    return {line.strip() for line in VLLM_NAMES.read_text().splitlines() if line.strip()}


@pytest.fixture(scope="session")
def exported() -> set[str]:
    return gateway_names() | simulator_names() | vllm_names() | PROMETHEUS_OWN


@pytest.fixture(scope="session")
def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


@pytest.fixture(scope="session")
def datasources() -> list[dict[str, Any]]:
    sources: list[dict[str, Any]] = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    return sources


def load_alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for g in groups for rule in g["rules"]]


@pytest.fixture(scope="session")
def alert_rules() -> list[dict[str, Any]]:
    return load_alert_rules()


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' collapsed children included."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "3h"}


def grafana_to_promql(expr: str) -> str:
    """Substitute Grafana's variables as Grafana would before sending the query."""
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")


def comparisons_as_bool(expr: str) -> str:
    """The expression with every comparison made `bool`: it then answers 0 or 1 for each
    series it compares instead of only those past the threshold, which shows whether the
    series it names exist at all. Label matchers and strings are left alone."""
    out, i, depth, quote = [], 0, 0, ""
    while i < len(expr):
        c = expr[i]
        if quote:
            quote = "" if c == quote and expr[i - 1] != "\\" else quote
        elif c in "\"'`":
            quote = c
        elif c in "{}":
            depth += 1 if c == "{" else -1
        elif depth == 0 and (op := next((o for o in COMPARISONS if expr.startswith(o, i)), "")):
            out.append(f"{op} bool")
            i += len(op)
            continue
        out.append(c)
        i += 1
    return "".join(out)


def promtool(*args: str) -> str:
    """Run promtool (Debian's `prometheus` package; .ci/run installs it); its output, or a
    failed test that shows it."""
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed: apt-get install prometheus (.ci/run does)"
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output
