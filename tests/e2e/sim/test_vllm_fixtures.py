"""The simulator against the recorded answers of real vLLM 0.32.0 (tests/vllm/fixtures).

The `vllm` suite compares the simulator with a live vLLM; this runs the same comparison
against the stored fixtures in the default run, so a change that makes the simulator
answer unlike vLLM fails here without a vLLM install.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import gateway_process
from tests.vllm import capture
from tests.vllm.shapes import answer_diff

FIXTURES = Path(__file__).parents[2] / "vllm" / "fixtures"
# vLLM serves /v1/embeddings only for embedding models; the simulator always does.
CASES = sorted(n for n in (*capture.PLAIN, *capture.STREAMS) if n != "embeddings")


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    """Configured as tests/vllm/conftest.py starts it, like the recorded servers."""
    args = ("sim", "--model", "tiny", "--block-size", "32", "--max-model-len", "4096")
    with gateway_process(*args, health_path="/v1/models") as url:
        yield url


@pytest.mark.parametrize("name", CASES)
def test_the_simulator_answers_as_vllm_did(name: str, sim_url: str) -> None:
    stored = json.loads((FIXTURES / f"{name}.json").read_text())
    with httpx.Client(base_url=sim_url, timeout=30) as client:
        if name in capture.STREAMS:
            got = capture.stream(client, *capture.STREAMS[name])
        else:
            got = capture.plain(client, *capture.PLAIN[name])
    diffs = answer_diff(stored, got)
    assert diffs == [], "\n".join(diffs)


def test_error_messages_are_vllms_word_for_word(sim_url: str) -> None:
    # answer_diff compares messages up to their numbers; the numbers match too.
    with httpx.Client(base_url=sim_url, timeout=30) as client:
        for name in CASES:
            stored = json.loads((FIXTURES / f"{name}.json").read_text())
            if "error" not in (stored.get("body") or {}):
                continue
            got = capture.plain(client, *capture.PLAIN[name])
            assert got["body"] == stored["body"], name
