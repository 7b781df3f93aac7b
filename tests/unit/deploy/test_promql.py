"""Every PromQL expression in the dashboard and the alert rules parses and uses only
metric names the gateway, the simulator or real vLLM export."""

from __future__ import annotations

from typing import Any

import promql_parser
import pytest

from tests.unit.deploy.conftest import COMPARISONS, comparisons_as_bool, grafana_to_promql, panels


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


GATEWAY_TOKENS = {"gateway_predicted_cached_tokens_total"}
"""Counted with the gateway's tokenizer (the prefix index's blocks)."""
BACKEND_TOKENS = {
    "gateway_reported_cached_tokens_total",
    "gateway_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
}
"""Counted with the model's own tokenizer, as the backends report usage."""
ARITHMETIC_AND_COMPARISONS = {"/", "*", "+", "-", "%", "^", ">", "<", ">=", "<=", "==", "!="}


def mixed_tokens(expr: str) -> list[str]:
    """The operations that weigh gateway tokens against backend tokens: two tokenizers
    count the same prompt differently, so such a ratio or threshold measures them, not
    the cache (gateway_cache_predictions_total compares shares, each in its own tokens)."""
    found: list[str] = []

    def visit(node: object) -> bool:
        if (
            isinstance(node, promql_parser.BinaryExpr)
            and str(node.op) in ARITHMETIC_AND_COMPARISONS
        ):
            sides = metric_names(str(node.lhs)), metric_names(str(node.rhs))
            for a, b in (sides, sides[::-1]):
                if a & GATEWAY_TOKENS and b & BACKEND_TOKENS:
                    found.append(str(node))
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def test_gateway_and_backend_tokens_are_never_weighed_against_each_other(
    dashboard: dict[str, Any], alert_rules: list[dict[str, Any]], exported: set[str]
) -> None:
    queries = dashboard_queries(dashboard) + [(r["alert"], r["expr"]) for r in alert_rules]
    for title, expr in queries:
        assert not mixed_tokens(grafana_to_promql(expr)), f"{title!r} mixes tokenizers: {expr}"
    assert exported >= BACKEND_TOKENS | GATEWAY_TOKENS


def test_mixed_tokens_are_caught() -> None:
    """The check has teeth: a ratio or a threshold across the two kinds is reported."""
    predicted = "sum(rate(gateway_predicted_cached_tokens_total[5m]))"
    reported = "sum(rate(gateway_reported_cached_tokens_total[5m]))"
    assert mixed_tokens(f"{predicted} / clamp_min({reported}, 1)")
    assert mixed_tokens(f"{reported} / {predicted}")
    assert mixed_tokens(f"{predicted} > 2 * {reported} and {predicted} > 100")
    assert not mixed_tokens(f"{predicted} > 100 and {reported} > 100")
    assert not mixed_tokens('sum(rate(gateway_tokens_total{kind="cached"}[5m])) / 2')


def test_comparisons_made_bool_leave_matchers_alone(alert_rules: list[dict[str, Any]]) -> None:
    expr = 'max(a{x!="1",y=~"<>"}) > 0 or sum(increase(b[15m])) >= 2 * c'
    assert comparisons_as_bool(expr) == (
        'max(a{x!="1",y=~"<>"}) > bool 0 or sum(increase(b[15m])) >= bool 2 * c'
    )

    def comparisons(expr: str) -> list[bool]:
        found: list[bool] = []

        def visit(node: object) -> bool:
            if isinstance(node, promql_parser.BinaryExpr) and str(node.op) in COMPARISONS:
                found.append(node.modifier is not None and node.modifier.return_bool)
            return True

        promql_parser.walk(promql_parser.parse(expr), visit)
        return found

    for rule in alert_rules:
        made = comparisons(comparisons_as_bool(rule["expr"]))
        assert made, rule["alert"]
        assert all(made), rule["alert"]
