"""The Grafana dashboard and its provisioning: structure Grafana needs to load them."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import yaml

from tests.unit.deploy.conftest import DEPLOY, ROOT, panels

PANEL_TYPES = {"row", "timeseries", "stat", "state-timeline", "table", "gauge", "bargauge"}
ROWS = ["Traffic", "Latency", "Cache", "Cost (ledger)", "Backends"]


def test_dashboard_top_level(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"]
    assert len(dashboard["uid"]) <= 40
    assert dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["schemaVersion"] >= 36
    assert isinstance(dashboard["panels"], list)
    assert dashboard["panels"]
    assert isinstance(dashboard["templating"]["list"], list)
    assert [p["title"] for p in dashboard["panels"] if p["type"] == "row"] == ROWS


def test_panel_ids_unique_and_types_known(dashboard: dict[str, Any]) -> None:
    all_panels = panels(dashboard)
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert all(isinstance(i, int) for i in ids)
    for p in all_panels:
        assert p["type"] in PANEL_TYPES, p["type"]
        assert p["title"]


def test_panels_sit_on_the_grid_without_overlapping(dashboard: dict[str, Any]) -> None:
    boxes = []
    for p in panels(dashboard):
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in ("x", "y", "w", "h")), p["title"]
        assert min(g["w"], g["h"]) >= 1, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        boxes.append((p["title"], g))
    for (ta, a), (tb, b) in combinations(boxes, 2):
        apart = (
            a["x"] + a["w"] <= b["x"]
            or b["x"] + b["w"] <= a["x"]
            or a["y"] + a["h"] <= b["y"]
            or b["y"] + b["h"] <= a["y"]
        )
        assert apart, f"{ta!r} overlaps {tb!r}"


def test_every_target_names_a_provisioned_datasource(
    dashboard: dict[str, Any], datasources: list[dict[str, Any]]
) -> None:
    provisioned = {d["uid"]: d["type"] for d in datasources}
    used = set()
    for p in panels(dashboard):
        if p["type"] == "row":
            continue
        targets = p["targets"]
        assert targets, f"panel {p['title']!r} has no query"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for ds in [p["datasource"], *(t["datasource"] for t in targets)]:
            assert provisioned.get(ds["uid"]) == ds["type"], (p["title"], ds)
            used.add(ds["uid"])
        for t in targets:
            query = t.get("expr") or t.get("rawSql")
            assert query, (p["title"], t)
    for var in dashboard["templating"]["list"]:
        assert provisioned.get(var["datasource"]["uid"]) == var["datasource"]["type"]
    assert used == set(provisioned), "every provisioned datasource serves some panel"


def test_datasources_point_at_the_compose_services(datasources: list[dict[str, Any]]) -> None:
    by_type = {d["type"]: d for d in datasources}
    assert by_type["prometheus"]["url"] == "http://prometheus:9090"
    assert by_type["prometheus"]["isDefault"] is True
    pg = by_type["grafana-postgresql-datasource"]
    assert pg["url"] == "postgres:5432"
    assert pg["jsonData"]["database"] == "gateway"
    # Grafana's reader role is created by the postgres init script.
    init = (DEPLOY / "postgres" / "grafana-reader.sql").read_text()
    assert f"CREATE ROLE {pg['user']} LOGIN PASSWORD '{pg['secureJsonData']['password']}'" in init


def test_dashboard_provider_reads_the_mounted_folder() -> None:
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yml").read_text()
    )["providers"][0]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in mounts
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
