"""deploy/prometheus/ through promtool: the config and the rules as Prometheus reads them,
and unit tests in which every alert fires on the series that should fire it and stays quiet
on their healthy twins (alerts_test.yml)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.unit.deploy.conftest import ALERTS, DEPLOY, load_alert_rules, promtool

ALERT_TESTS = Path(__file__).parent / "alerts_test.yml"


def test_config_and_rules_load_as_prometheus_reads_them() -> None:
    rules = len(load_alert_rules())
    config = promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert "SUCCESS: 1 rule files found" in config
    assert f"SUCCESS: {rules} rules found" in promtool("check", "rules", str(ALERTS))


def test_alert_rules_pass_their_unit_tests() -> None:
    assert "SUCCESS" in promtool("test", "rules", str(ALERT_TESTS))


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    names = {r["alert"] for r in load_alert_rules()}
    assert fires == names, f"no case fires {sorted(names - fires)}"
    assert quiet == names, f"no case keeps {sorted(names - quiet)} quiet"
