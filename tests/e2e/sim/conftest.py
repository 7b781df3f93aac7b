from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.sim import RunningSimulator, SimConfig, start_simulator

StartSim = Callable[..., Awaitable[RunningSimulator]]


@pytest.fixture
async def start_sim() -> AsyncIterator[StartSim]:
    """Start in-process simulators (SimConfig keywords); all are closed after the test."""
    started: list[RunningSimulator] = []

    async def start(**options: Any) -> RunningSimulator:
        sim = await start_simulator(SimConfig(model="sim", **options))
        started.append(sim)
        return sim

    yield start
    for sim in started:
        await sim.aclose()


def client_for(sim: RunningSimulator) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)


async def scrape(sim: RunningSimulator) -> dict[str, float]:
    """The simulator's /metrics as {sample name: value}, parsed by prometheus_client."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(sim.url + "/metrics")).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "le" not in s.labels and "finished_reason" not in s.labels
    }
