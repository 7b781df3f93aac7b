"""deploy/k8s: every core object validates against the Kubernetes schema (strict), and
the objects refer to each other correctly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from gateway.settings import load_settings
from tests.unit.deploy.conftest import DEPLOY

K8S = DEPLOY / "k8s"
NOT_CORE = {"ServiceMonitor", "Kustomization"}
"""Custom resources, checked by hand below: no bundled schema."""


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    """kind/name -> object, from every manifest file."""
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            out[f"{doc['kind']}/{doc.get('metadata', {}).get('name', path.stem)}"] = doc
    return out


def test_core_objects_validate_strictly(objects: dict[str, dict[str, Any]]) -> None:
    checked = 0
    for doc in objects.values():
        if doc["kind"] in NOT_CORE:
            continue
        kubernetes_validate.validate(doc, latest_version(), strict=True)
        checked += 1
    assert checked >= 7


def test_validation_has_teeth(objects: dict[str, dict[str, Any]]) -> None:
    bad = yaml.safe_load(yaml.safe_dump(objects["Deployment/gateway"]))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, latest_version(), strict=True)


def test_kustomization_lists_every_manifest(objects: dict[str, dict[str, Any]]) -> None:
    listed = objects["Kustomization/kustomization"]["resources"]
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(listed) == sorted(on_disk)


def test_deployment_probes_config_and_migrations(
    objects: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    deploy = objects["Deployment/gateway"]
    pod = deploy["spec"]["template"]
    assert deploy["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [container] = pod["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["args"][:1] == ["serve"]
    [init] = pod["spec"]["initContainers"]
    assert init["args"][:1] == ["migrate"]
    assert init["image"] == container["image"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config_map = objects[f"ConfigMap/{volumes['config']['configMap']['name']}"]
    secret = objects[f"Secret/{container['envFrom'][0]['secretRef']['name']}"]
    for c in (container, init):
        config_arg = c["args"][c["args"].index("--config") + 1]
        mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
        assert config_arg == f"{mount['mountPath']}/gateway.yaml"
    # The mounted config and the secret's environment make valid settings.
    (tmp_path / "gateway.yaml").write_text(config_map["data"]["gateway.yaml"])
    settings = load_settings(tmp_path / "gateway.yaml")
    assert settings.server.workers == 1
    assert settings.redis.url is not None
    assert set(secret["stringData"]) == {"GATEWAY_DATABASE__URL", "GATEWAY_AUTH__ADMIN_KEY"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(settings.ledger.spool_dir) in mounts


def test_service_hpa_and_servicemonitor_point_at_the_gateway(
    objects: dict[str, dict[str, Any]],
) -> None:
    deploy = objects["Deployment/gateway"]
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"] for p in deploy["spec"]["template"]["spec"]["containers"][0]["ports"]}
    service = objects["Service/gateway"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    hpa = objects["HorizontalPodAutoscaler/gateway"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "gateway")
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    monitor = objects["ServiceMonitor/gateway"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_redis_and_postgres_are_external(objects: dict[str, dict[str, Any]]) -> None:
    for name in ("gateway-redis", "gateway-postgres"):
        assert objects[f"Service/{name}"]["spec"]["type"] == "ExternalName"
    kinds = {doc["kind"] for doc in objects.values()}
    assert "StatefulSet" not in kinds
