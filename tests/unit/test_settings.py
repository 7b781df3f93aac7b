from decimal import Decimal
from pathlib import Path

import pytest

from gateway.settings import SettingsError, load_settings


def test_defaults_are_the_embedded_mode() -> None:
    s = load_settings()
    assert s.embedded
    assert not s.auth_enabled
    assert s.database.url.startswith("sqlite")
    assert s.redis.url is None


def test_yaml_file_then_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "g.yaml"
    cfg.write_text(
        "server: {port: 9000}\n"
        "database: {url: 'postgresql://db/gw'}\n"
        "models:\n"
        "  - name: llama\n"
        "    backends: [{url: 'http://10.0.0.1:8000/v1'}]\n"
        "    price: {input: '3.00', cached_input: '0.30', output: '15'}\n"
    )
    monkeypatch.setenv("GATEWAY_SERVER__PORT", "9100")
    s = load_settings(cfg)
    assert s.server.port == 9100
    assert s.models[0].price.cached_input == Decimal("0.30")
    assert not s.embedded
    assert s.auth_enabled


def test_bad_settings_fail_fast_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not found"):
        load_settings(tmp_path / "missing.yaml")
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("models:\n  - {name: a, backends: []}\n  - {name: a, backends: []}\n")
    with pytest.raises(SettingsError, match="configured twice"):
        load_settings(cfg)
    cfg.write_text("routing: {policy: random}\n")
    with pytest.raises(SettingsError, match="policy"):
        load_settings(cfg)


def test_the_example_config_loads() -> None:
    s = load_settings(Path(__file__).parents[2] / "gateway.example.yaml")
    assert s.models[0].backends[1].api_key == "backend-secret"
    assert s.routing.policy == "cache_aware"
