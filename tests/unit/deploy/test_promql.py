"""Every PromQL expression in the dashboard and the alert rules parses and uses only
metric names the gateway, the simulator or real vLLM export."""

from __future__ import annotations

from typing import Any

import promql_parser
import pytest

from tests.unit.deploy.conftest import grafana_to_promql, panels


def metric_names(expr: str) -> set[str]:
    """The metric names of every selector in a PromQL expression (syntax errors raise)."""
    names: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name or "")
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            if "expr" in t:
                out.append((p["title"], t["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            inner = var["query"]["query"]
            out.append((var["name"], inner.removeprefix("label_values(").split(",")[0]))
    return out


def test_selector_extraction_sees_every_name() -> None:
    expr = "sum(rate(a_total[5m])) / clamp_min(sum(rate(b_bucket{x='1'}[5m] offset 1h)), 1) > c"
    assert metric_names(expr) == {"a_total", "b_bucket", "c"}
    with pytest.raises(ValueError, match=r".+"):
        metric_names("sum(rate(a_total[5m])")


def test_dashboard_queries_use_exported_metrics(
    dashboard: dict[str, Any], exported: set[str]
) -> None:
    queries = dashboard_queries(dashboard)
    assert len(queries) > 30
    for title, expr in queries:
        unknown = metric_names(grafana_to_promql(expr)) - exported
        assert not unknown, f"panel {title!r} queries {sorted(unknown)}: not exported"


def test_alert_rules_use_exported_metrics(
    alert_rules: list[dict[str, Any]], exported: set[str]
) -> None:
    for rule in alert_rules:
        unknown = metric_names(rule["expr"]) - exported
        assert not unknown, f"alert {rule['alert']} uses {sorted(unknown)}: not exported"


def test_alert_rules_cover_the_pages(alert_rules: list[dict[str, Any]]) -> None:
    by_name = {r["alert"]: r for r in alert_rules}
    assert len(by_name) == len(alert_rules), "alert names must be unique"
    watched = {
        "GatewayTTFTHigh": "gateway_time_to_first_token_seconds_bucket",
        "GatewayErrorRatioHigh": "gateway_requests_total",
        "GatewayBackendDown": "gateway_backend_healthy",
        "GatewayCacheHitRatioCollapsed": "gateway_tokens_total",
        "GatewayLedgerSpoolGrowing": "gateway_ledger_spool_rows",
        "GatewayLedgerDeadLetters": "gateway_ledger_dead_letter_rows",
    }
    for alert, metric in watched.items():
        assert metric in metric_names(by_name[alert]["expr"]), alert
    for rule in alert_rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"]
        assert promql_parser.parse_duration(rule.get("for", "0s")) is not None


def test_unknown_names_are_caught(exported: set[str]) -> None:
    """The check has teeth: a typo or a metric nobody exports is reported."""
    assert metric_names("rate(gateway_request_total[5m])") - exported == {"gateway_request_total"}
    assert "vllm:num_requests_waiting" in exported
    assert "gateway_time_to_first_token_seconds_bucket" in exported
    assert "gateway_cost_usd_total" in exported
