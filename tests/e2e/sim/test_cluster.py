"""`gateway sim --instances N`: a local cluster on consecutive ports, from one command."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import consecutive_free_ports, gateway_process


def cache_blocks(base: str) -> str:
    text = httpx.get(base + "/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            return family.samples[0].labels["num_gpu_blocks"]
    raise AssertionError("no vllm:cache_config_info")


def test_instances_serve_consecutive_ports_with_their_own_cache_sizes() -> None:
    with gateway_process(
        "sim", "--instances", "2", "--cache-blocks", "64,128", "--instant",
        port=consecutive_free_ports(2),
    ) as first:  # fmt: skip
        host, port = first.rsplit(":", 1)
        second = f"{host}:{int(port) + 1}"
        body = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
        names = [
            httpx.post(u + "/v1/chat/completions", json=body).headers["x-backend-instance"]
            for u in (first, second)
        ]
        assert names == [f"sim-{port}", f"sim-{int(port) + 1}"]
        assert [cache_blocks(first), cache_blocks(second)] == ["64", "128"]
