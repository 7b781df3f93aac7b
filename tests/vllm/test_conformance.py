"""The simulator against real vLLM: the same requests, answers compared field by field.

The requests are the ones tests.vllm.capture records as fixtures; the same comparison
also checks that the stored fixtures still describe the live vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.vllm import capture
from tests.vllm.shapes import answer_diff, shape_diff

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(120, func_only=True)]

FIXTURES = Path(__file__).parent / "fixtures"
# vLLM serves /v1/embeddings only for embedding models; the simulator always does (the
# gateway batches embeddings), so that answer is compared by nobody.
CASES = sorted(n for n in (*capture.PLAIN, *capture.STREAMS) if n != "embeddings")


def record(base_url: str, name: str) -> dict[str, Any]:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        if name in capture.STREAMS:
            return capture.stream(client, *capture.STREAMS[name])
        return capture.plain(client, *capture.PLAIN[name])


def explain(diffs: list[str]) -> str:
    return "\n".join(diffs)


@pytest.mark.parametrize("name", CASES)
def test_simulator_answers_like_vllm(name: str, vllm_urls: list[str], sim_url: str) -> None:
    diffs = answer_diff(record(vllm_urls[1], name), record(sim_url, name))
    assert diffs == [], explain(diffs)


@pytest.mark.parametrize("name", CASES)
def test_fixtures_still_describe_vllm(name: str, vllm_urls: list[str]) -> None:
    stored = json.loads((FIXTURES / f"{name}.json").read_text())
    diffs = answer_diff(record(vllm_urls[1], name), stored)
    assert diffs == [], explain(diffs)


def test_simulator_caches_a_repeated_prompt_like_vllm(vllm_urls: list[str], sim_url: str) -> None:
    with httpx.Client(base_url=vllm_urls[1], timeout=60) as client:
        want = capture.cached_repeat(client)
    with httpx.Client(base_url=sim_url, timeout=60) as client:
        got = capture.cached_repeat(client)
    for answers in (want, got):
        details = [answers[k]["body"]["usage"]["prompt_tokens_details"] for k in answers]
        assert details[1]["cached_tokens"] > 0
    diffs = shape_diff(want, got)
    assert diffs == [], explain(diffs)


def test_simulator_exports_the_engine_metrics_the_gateway_reads(
    vllm_urls: list[str], sim_url: str
) -> None:
    def key_samples(url: str) -> dict[str, str]:
        text = httpx.get(url + "/metrics", timeout=5).text
        lines = capture.metrics_excerpt(text)
        # name -> sorted label names, e.g. vllm:num_requests_running -> engine,model_name
        return {
            line.split("{")[0]: ",".join(sorted(p.split("=")[0] for p in
                                                line.split("{")[1].split("}")[0].split(",")))
            for line in lines
        }  # fmt: skip

    want, got = key_samples(vllm_urls[1]), key_samples(sim_url)
    assert set(want) == set(capture.KEY_METRICS) | {"vllm:num_requests_waiting_by_reason"}
    assert {k: v for k, v in got.items() if k in capture.KEY_METRICS} == {
        k: v for k, v in want.items() if k in capture.KEY_METRICS
    }
