"""A real Prometheus scrapes a gateway (two workers) and two simulators through a short
load; then every Prometheus query of the dashboard and every alert rule runs through its
HTTP API and must return series: a panel that shows nothing is a broken panel.

A healthy load cannot produce every condition: those few expressions are listed below with
the reason, and promtool evaluates them on series that hold the condition (the panels here,
the alerts in tests/integration/deploy/alerts_test.yml).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.bench.limits import scratch_redis_prefix
from tests.e2e.conftest import MODEL, write_config
from tests.e2e.metrics.traffic import fresh_connections, run_mix
from tests.servers import free_port, gateway_process, prometheus_process
from tests.unit.deploy.conftest import (
    ALERTS,
    DASHBOARD,
    DEPLOY,
    comparisons_as_bool,
    grafana_to_promql,
    load_alert_rules,
    panels,
    promtool,
)

DOWN_MODEL = "down-model"
"""A model whose only backend listens nowhere: its calls fail with 503 (the 5xx panels)."""

NEEDS_A_FAILING_BACKEND = {
    ("Retries, disconnects, batched calls", "A"): (
        [{"series": f'gateway_upstream_retries_total{{model="{MODEL}"}}', "values": "0+60x10"}],
        [{"labels": "{}", "value": 1}],
    ),
}
"""Panel targets a healthy load leaves empty (a retry needs a backend that fails a call
after its health probe passed, as in tests/e2e/gateway/test_slow_backends.py), with series
that hold the condition (a minute apart) and what the query answers on them after 10 m."""

NEEDS_HISTORY = {"GatewayCacheHitRatioCollapsed"}
"""Alerts comparing with hours before the test began: their promtool tests cover them."""

SCRAPE_INTERVAL = "1s"


@dataclass(frozen=True)
class Observed:
    prometheus: str
    dead_backend: str
    """The down model's backend (host:port), which nothing answers on."""


def prometheus_config(gateway: str, sims: list[str]) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml (its jobs, its alert rules) aimed at the test's
    processes, scraping every second."""
    config: dict[str, Any] = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "1s"}
    config["rule_files"] = [str(ALERTS)]
    targets = {"gateway": [gateway], "vllm": sims}
    for job in config["scrape_configs"]:
        hosts = [t.removeprefix("http://") for t in targets.pop(job["job_name"])]
        job["static_configs"] = [{"targets": hosts}]
    assert not targets, f"deploy/prometheus/prometheus.yml lacks the jobs {sorted(targets)}"
    return config


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    """An instant query; a query Prometheus refuses fails the test with its error."""
    resp = httpx.get(prometheus + "/api/v1/query", params={"query": expr}, timeout=30)
    body = resp.json()
    assert body["status"] == "success", f"{expr}: {body.get('error')}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def burst(base_url: str, prompt: str, n: int = 6) -> int:
    """n identical deterministic calls at once: the gateway may coalesce them or hold them
    for one leader's prefix (the batched-calls panel)."""

    def one(_: int) -> None:
        with fresh_connections(base_url) as client:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=8,
                temperature=0,
            )

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))
    return n


def leave_a_stream(base_url: str) -> int:
    """A streamed call its client abandons after the first chunk (the disconnects panel)."""
    with fresh_connections(base_url) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "a long answer, please"}],
            max_tokens=400,
            stream=True,
        )
        next(iter(stream))
        stream.close()
    return 1


def call_the_down_model(base_url: str) -> int:
    with fresh_connections(base_url) as client, pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model=DOWN_MODEL, messages=[{"role": "user", "content": "anyone?"}], max_tokens=2
        )
    assert info.value.status_code >= 500
    return 1


def load(base_url: str) -> int:
    """One round of the bounded load; returns the number of calls it made."""
    exp = run_mix(base_url, rounds=2)
    calls = sum(exp.requests.values())
    long_prompt = " ".join(f"word{i}" for i in range(400))
    for i in range(2):
        calls += burst(base_url, f"{long_prompt} burst {i}")
    calls += leave_a_stream(base_url)
    calls += call_the_down_model(base_url)
    return calls


TARGETS = 3
"""The gateway and two simulators."""


def scraped_at(prometheus: str) -> float:
    """When Prometheus last scraped all targets (0 before it scraped each once)."""
    times = query(prometheus, "timestamp(up)")
    return min(float(s["value"][1]) for s in times) if len(times) == TARGETS else 0


def wait_for_scrape(prometheus: str, after: float, deadline: float) -> float:
    """Wait until Prometheus scraped every target after that time; returns the time (the
    deadline only bounds a scrape that never comes)."""
    while time.monotonic() < deadline:
        if (at := scraped_at(prometheus)) > after:
            return at
        time.sleep(0.2)
    raise AssertionError(f"Prometheus scraped not all targets after {after}")


def run_load(prometheus: str, gateway: str, timeout: float = 120) -> int:
    """Two rounds of load with a scrape before, between and after them: a series is born
    at its first call, so rate() sees only what a later scrape adds to it. Returns the
    number of calls, once Prometheus holds them all and scraped once more."""
    deadline = time.monotonic() + timeout
    at = wait_for_scrape(prometheus, 0, deadline)
    calls = load(gateway)
    at = wait_for_scrape(prometheus, at + 1, deadline)
    calls += load(gateway)
    total: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        total = query(prometheus, "sum(gateway_requests_total)")
        if total and float(total[0]["value"][1]) == calls:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"Prometheus never saw all {calls} calls: {total}")
    wait_for_scrape(prometheus, float(total[0]["value"][0]) + 1, deadline)
    return calls


@pytest.fixture(scope="module")
def observed(
    sims: list[str], redis_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Observed]:
    tmp = tmp_path_factory.mktemp("prometheus")
    with ExitStack() as stack:
        prefix = stack.enter_context(scratch_redis_prefix(redis_server_url, "gwtest"))
        cfg = write_config(
            tmp / "gateway.yaml",
            sims,
            price={"input": "3.00", "cached_input": "0.30", "output": "15.00"},
            redis={"url": redis_server_url, "key_prefix": prefix},
        )
        config = yaml.safe_load(cfg.read_text())
        dead = f"127.0.0.1:{free_port()}"
        config["models"].append({"name": DOWN_MODEL, "backends": [{"url": f"http://{dead}"}]})
        cfg.write_text(yaml.safe_dump(config))
        gateway = stack.enter_context(
            gateway_process("serve", "--config", str(cfg), "--workers", "2")
        )
        target = gateway.removeprefix("http://")
        prometheus = stack.enter_context(prometheus_process(prometheus_config(target, sims), tmp))
        run_load(prometheus, gateway)
        yield Observed(prometheus, dead)


def prometheus_targets() -> list[tuple[str, str, str]]:
    """(panel, refId, PromQL) of every Prometheus query on the dashboard, variables as
    Grafana substitutes them (All models; a 5-minute rate window covers the whole test)."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            if "expr" in t:
                out.append((p["title"], t["refId"], grafana_to_promql(t["expr"])))
    return out


def finite(result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in result if not math.isnan(float(s["value"][1]))]


@pytest.mark.parametrize(
    ("panel", "ref", "expr"),
    prometheus_targets(),
    ids=[f"{p}/{r}" for p, r, _ in prometheus_targets()],
)
def test_every_dashboard_query_shows_the_load(
    observed: Observed, panel: str, ref: str, expr: str
) -> None:
    raw = query(observed.prometheus, expr)
    result = finite(raw)
    if (panel, ref) in NEEDS_A_FAILING_BACKEND:
        assert result == [], f"{panel!r} {ref} shows a failure this load does not have"
    else:
        assert result, f"panel {panel!r} ({ref}) shows nothing after the load: {expr} {raw}"


@pytest.mark.parametrize("rule", load_alert_rules(), ids=lambda r: r["alert"])
def test_every_alert_rule_sees_its_series(observed: Observed, rule: dict[str, Any]) -> None:
    """Each comparison made `bool`, the rule's expression answers 0 or 1 for every series
    it watches: a series it names wrongly (metric, label, job) answers nothing."""
    result = finite(query(observed.prometheus, comparisons_as_bool(rule["expr"])))
    if rule["alert"] in NEEDS_HISTORY:
        assert result == []
    else:
        assert result, f"alert {rule['alert']} watches no series after the load"


def test_prometheus_evaluates_every_rule_and_sees_the_dead_backend(observed: Observed) -> None:
    body = httpx.get(observed.prometheus + "/api/v1/rules", timeout=30).json()
    rules = [r for g in body["data"]["groups"] for r in g["rules"]]
    assert {r["name"] for r in rules} == {r["alert"] for r in load_alert_rules()}
    for r in rules:
        assert r["health"] == "ok", (r["name"], r.get("lastError"))
    [down] = [r for r in rules if r["name"] == "GatewayBackendDown"]
    assert [a["labels"]["backend"] for a in down["alerts"]] == [observed.dead_backend]


def test_queries_a_healthy_load_leaves_empty_answer_on_their_condition(tmp_path: Path) -> None:
    queries = {(p, r): expr for p, r, expr in prometheus_targets()}
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [{"expr": queries[target], "eval_time": "10m", "exp_samples": exp}],
        }
        for target, (series, exp) in NEEDS_A_FAILING_BACKEND.items()
    ]
    spec = tmp_path / "panels_test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [], "tests": tests}))
    assert "SUCCESS" in promtool("test", "rules", str(spec))
