"""/metrics after a known mix of calls: exact request and token counts, one TTFT per stream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import MODEL, write_config
from tests.e2e.metrics.traffic import Expected, Scrape, run_mix, scrape
from tests.servers import gateway_process


@pytest.fixture(scope="module")
def traffic(
    sims: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Expected, Scrape, list[str]]]:
    """A gateway of its own (its counters start at zero), the mix, then one scrape."""
    cfg = write_config(tmp_path_factory.mktemp("gw-metrics") / "gateway.yaml", sims)
    with gateway_process("serve", "--config", str(cfg)) as url:
        expected = run_mix(url)
        yield expected, scrape(url), sims


def test_requests_counted_by_endpoint_and_status(
    traffic: tuple[Expected, Scrape, list[str]],
) -> None:
    exp, got, _ = traffic
    for (endpoint, status), n in exp.requests.items():
        assert got.total("gateway_requests_total", endpoint=endpoint, status=status) == n
    assert got.total("gateway_requests_total") == sum(exp.requests.values())
    # The made-up model name never became a label value.
    assert "no-such-model" not in got.text
    assert got.total("gateway_requests_total", status="404", model="") == 1


def test_tokens_match_what_the_clients_were_told(
    traffic: tuple[Expected, Scrape, list[str]],
) -> None:
    exp, got, _ = traffic
    assert got.total("gateway_tokens_total", kind="prompt", model=MODEL) == exp.prompt
    assert got.total("gateway_tokens_total", kind="cached", model=MODEL) == exp.cached
    assert got.total("gateway_tokens_total", kind="completion", model=MODEL) == exp.completion
    assert exp.cached > 0, "the mix repeats a long prompt: some of it must come from cache"
    assert got.total("gateway_reported_cached_tokens_total", model=MODEL) == exp.cached


def test_one_ttft_per_streamed_call(traffic: tuple[Expected, Scrape, list[str]]) -> None:
    exp, got, _ = traffic
    assert got.total("gateway_time_to_first_token_seconds_count") == exp.streamed
    assert got.total("gateway_time_to_first_token_seconds_count", stream="false") == 0
    assert got.total("gateway_time_per_output_token_seconds_count") == exp.streamed
    assert got.total("gateway_request_duration_seconds_count") == exp.dispatched
    assert got.total("gateway_request_duration_seconds_count", stream="true") == exp.streamed


def test_overhead_observed_per_call_and_sent_as_a_header(
    traffic: tuple[Expected, Scrape, list[str]],
) -> None:
    exp, got, _ = traffic
    assert got.total("gateway_overhead_seconds_count") == exp.dispatched
    assert all(0 < ms < 1000 for ms in exp.overheads), exp.overheads
    # Overhead is part of the end-to-end time, never more than it.
    assert got.total("gateway_overhead_seconds_sum") < got.total(
        "gateway_request_duration_seconds_sum"
    )


def test_routing_connections_and_backend_gauges(
    traffic: tuple[Expected, Scrape, list[str]],
) -> None:
    exp, got, sims = traffic
    routed = exp.requests["chat", "200"] + exp.requests["completions", "200"]
    assert got.total("gateway_routing_decisions_total", model=MODEL) == routed
    backends = {dict(k)["backend"] for k in got.values("gateway_backend_healthy")}
    assert backends == {s.removeprefix("http://") for s in sims}
    for backend in backends:
        assert got.total("gateway_backend_healthy", backend=backend) == 1
        assert got.total("gateway_backend_in_flight_requests", backend=backend) == 0
    # Connections are pooled: opened at least once, far fewer times than calls were made.
    opened = got.total("gateway_upstream_connect_seconds_count")
    connected = {dict(k)["backend"] for k in got.values("gateway_upstream_connect_seconds_count")}
    assert connected <= backends
    assert 1 <= opened < exp.dispatched
    assert got.total("gateway_prefix_index_handles") > 0
    assert got.total("gateway_python_allocated_blocks") > 100_000  # the heap, not a count
    assert got.total("gateway_upstream_retries_total") == 0
    assert got.total("gateway_client_disconnects_total") == 0


def test_cost_and_ledger_series_are_exported(traffic: tuple[Expected, Scrape, list[str]]) -> None:
    _, got, _ = traffic
    names = {n for n, _, _ in got.samples}
    for name in (
        "gateway_cost_usd_total",
        "gateway_ledger_queue_depth",
        "gateway_ledger_spool_rows",
        "gateway_ledger_rows_written_total",
    ):
        assert name in names, name
