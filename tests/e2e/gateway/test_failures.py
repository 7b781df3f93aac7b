"""Backends that are down, slow, or abandoned by their client."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL, write_config
from tests.servers import free_port, gateway_process


def test_unreachable_backend_is_503(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = write_config(tmp_path / "g.yaml", [dead])
    with gateway_process("serve", "--config", str(cfg)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 503
        assert httpx.get(url + "/ready").status_code == 503
        assert httpx.get(url + "/health").status_code == 200


def test_refused_connection_is_retried_on_a_live_backend(sims: list[str], tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    # Health probes are slow here, so the dead backend still looks healthy when called.
    cfg = write_config(tmp_path / "g.yaml", [dead, sims[0]], upstream={"health_interval": 60})
    with gateway_process("serve", "--config", str(cfg), health_path="/health") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        for _ in range(3):
            resp = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
            assert resp.choices[0].message.content is not None


def test_backend_timeout_is_504(sims: list[str], tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "g.yaml", sims[:1], upstream={"read_timeout": 0.2})
    with gateway_process("serve", "--config", str(cfg)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            # 40 decode steps of ~12 ms: the whole answer takes far longer than 0.2 s.
            client.completions.create(model=MODEL, prompt="slow", max_tokens=40)
        assert info.value.status_code == 504


def sim_counter(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics").text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    )


def test_client_disconnect_aborts_the_backend_request(sims: list[str], gateway_url: str) -> None:
    before = sum(sim_counter(s, "vllm:request_abort_total") for s in sims)
    body = {"model": MODEL, "prompt": "go on", "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", gateway_url + "/v1/completions", json=body, timeout=10) as resp:
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        after = sum(sim_counter(s, "vllm:request_abort_total") for s in sims)
        running = sum(sim_counter(s, "vllm:num_requests_running") for s in sims)
        if after == before + 1 and running == 0:
            break
        time.sleep(0.05)
    assert after == before + 1
    assert running == 0
