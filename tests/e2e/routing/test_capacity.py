"""A backend's KV capacity comes from its own metrics, as vLLM exports them."""

from __future__ import annotations

from contextlib import ExitStack

from prometheus_client import CollectorRegistry

from gateway.backends import BackendPool
from gateway.metrics import GatewayMetrics
from gateway.settings import load_settings
from tests.e2e.conftest import MODEL, start_sims


async def test_a_scrape_bounds_the_index_by_blocks_times_block_size() -> None:
    with ExitStack() as stack:
        (url,) = start_sims(stack, 1, "--cache-blocks", "40", "--block-size", "32")
        settings = load_settings(models=[{"name": MODEL, "backends": [{"url": url}]}])
        told: dict[str, int] = {}
        pool = BackendPool(
            settings.models,
            settings.upstream,
            GatewayMetrics(CollectorRegistry()),
            lambda backend, tokens: told.__setitem__(backend, tokens),
        )
        await pool.start()
        try:
            (backend,) = pool.backends.values()
            assert told == {backend.name: 40 * 32}
            assert backend.backlog.capacity_tokens == 40 * 32
        finally:
            await pool.aclose()
