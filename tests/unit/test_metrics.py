"""GatewayMetrics: names and labels as exported, cached series, in-flight per process mode."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics, render


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = render(registry, None).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_series_are_resolved_once_and_land_under_their_labels() -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    s = m.series("m1", "b1", "chat", "true")
    assert m.series("m1", "b1", "chat", "true") is s
    s.ttft.observe(0.03)
    s.prompt.inc(7)
    call = frozenset({"model": "m1", "backend": "b1", "endpoint": "chat", "stream": "true"}.items())
    got = samples(registry)
    assert got["gateway_time_to_first_token_seconds_count", call] == 1
    assert got["gateway_time_to_first_token_seconds_bucket", call | {("le", "0.04")}] == 1
    assert got["gateway_time_to_first_token_seconds_bucket", call | {("le", "0.02")}] == 0
    tokens = frozenset({"model": "m1", "backend": "b1", "kind": "prompt"}.items())
    assert got["gateway_tokens_total", tokens] == 7
    assert m.child(m.requests, "m1", "chat", "200", "") is m.child(
        m.requests, "m1", "chat", "200", ""
    )


def test_in_flight_is_read_at_scrape_time_in_one_process() -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    load = {"n": 0}
    m.watch_in_flight("b1", lambda: load["n"])
    m.count_in_flight("b1", 1)  # one process: the callback is the truth, nothing to count
    load["n"] = 3
    key = ("gateway_backend_in_flight_requests", frozenset({("backend", "b1")}))
    assert samples(registry)[key] == 3
    assert b"gateway_backend_in_flight_requests" in generate_latest(registry)
