"""docker-compose.yml, the Dockerfile and the configs they mount, checked statically
(no Docker engine here): the compose spec, references between services, and the files."""

from __future__ import annotations

import json
import re
from typing import Any

import compose_spec
import pytest
import yaml

from gateway.settings import load_settings
from tests.unit.deploy.conftest import DEPLOY, ROOT

COMPOSE = ROOT / "docker-compose.yml"
VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(text: str) -> str:
    """Compose's ${VAR:-default} with nothing set: the defaults."""
    return VARIABLE.sub(lambda m: m.group(2) or "", text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(interpolate(COMPOSE.read_text()))
    return services


def test_valid_against_the_compose_spec(compose: dict[str, Any]) -> None:
    parsed = compose_spec.PyCompose.from_json(json.dumps(compose))
    parsed.validate()  # networks, volumes, configs and secrets used are all declared
    assert set(parsed.service_names()) == set(compose["services"])


def test_the_spec_check_has_teeth(compose: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(compose))
    broken["services"]["gateway"]["depends_on"]["postgres"]["condition"] = "service_ready"
    with pytest.raises(ValueError, match="unknown variant"):
        compose_spec.PyCompose.from_json(json.dumps(broken))


def test_services_and_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    always = {"gateway", "postgres", "redis", "prometheus", "grafana"}
    assert always <= set(services)
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{name} depends on unknown {dep}"
            assert "profiles" not in services[dep], f"{name} depends on a profiled {dep}"
    profiles = {name: tuple(svc.get("profiles", ())) for name, svc in services.items()}
    assert {n for n, p in profiles.items() if p == ("sim",)} == {"sim-1", "sim-2"}
    assert {n for n, p in profiles.items() if p == ("gpu",)} == {"vllm-1", "vllm-2"}
    assert {n for n, p in profiles.items() if not p} == always
    assert "COMPOSE_PROFILES=sim" in (ROOT / ".env").read_text().splitlines()


def aliases(svc: dict[str, Any]) -> set[str]:
    return set(svc["networks"]["default"]["aliases"])


def test_both_profiles_provide_the_backends_the_gateway_uses(compose: dict[str, Any]) -> None:
    services = compose["services"]
    config = load_settings(DEPLOY / "gateway.compose.yaml")
    hosts = {b.url.split("//")[1].split(":")[0] for m in config.models for b in m.backends}
    assert hosts == {"backend-1", "backend-2"}
    assert aliases(services["sim-1"]) | aliases(services["sim-2"]) == hosts
    assert aliases(services["vllm-1"]) | aliases(services["vllm-2"]) == hosts
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in prometheus["scrape_configs"]}
    assert jobs["vllm"] == ["backend-1:8000", "backend-2:8000"]
    assert jobs["gateway"] == [f"gateway:{config.server.port}"]
    model = config.models[0].name
    for sim in ("sim-1", "sim-2"):
        command = services[sim]["command"]
        assert command[:1] == ["sim"]
        assert command[command.index("--model") + 1] == model


def test_vllm_servers_cache_prefixes_and_report_cached_tokens(compose: dict[str, Any]) -> None:
    config = load_settings(DEPLOY / "gateway.compose.yaml")
    for name in ("vllm-1", "vllm-2"):
        svc = compose["services"][name]
        assert svc["image"].startswith("vllm/vllm-openai:")
        args = svc["command"]
        assert "--enable-prefix-caching" in args
        assert "--enable-prompt-tokens-details" in args
        assert args[args.index("--served-model-name") + 1] == config.models[0].name
        assert svc["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_gateway_migrates_before_it_serves(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["gateway"]
    [script] = gateway["command"]
    assert re.fullmatch(r"gateway migrate --config (\S+) && exec gateway serve --config \1", script)
    assert gateway["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    config = load_settings(DEPLOY / "gateway.compose.yaml")
    assert config.database.url.startswith("postgresql://")
    assert config.redis.url == "redis://redis:6379/0"
    assert config.server.host == "0.0.0.0"


def test_mounted_files_exist(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name} uses undeclared volume {source}"


def test_grafana_anonymous_viewer(compose: dict[str, Any]) -> None:
    env = compose["services"]["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_dockerfile_installs_the_package_on_python_311_slim() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "FROM python:3.11-slim"
    assert any(re.match(r"RUN pip install (-e )?\.", line) for line in lines)
    assert "COPY migrations ./migrations" in lines
    assert 'ENTRYPOINT ["gateway"]' in lines
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ".venv" in ignored
    assert ".git" in ignored
