"""A backend's own 4xx reaches the client, the metrics and the access log with its type."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL


def requests_by_error(url: str, error_type: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "gateway_requests_total" and s.labels["error_type"] == error_type
    )


def test_a_backend_refusal_keeps_its_status_and_type(gateway_url: str) -> None:
    before = requests_by_error(gateway_url, "BadRequestError")
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        # More than the simulator's max_model_len (8192): vLLM's 400, not the gateway's.
        client.completions.create(model=MODEL, prompt="hi", max_tokens=100_000)
    assert info.value.status_code == 400
    assert isinstance(info.value.body, dict)
    assert info.value.body["type"] == "BadRequestError"
    assert requests_by_error(gateway_url, "BadRequestError") == before + 1
    assert requests_by_error(gateway_url, "internal_error") == 0
