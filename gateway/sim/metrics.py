"""GET /metrics: the engine's state and counters under vLLM's metric names and labels.

A collector reads the engine at scrape time, so the request path only bumps plain
integers. Names and labels (`engine`, `model_name`) are vLLM's, so a gateway that scrapes
a real vLLM reads the simulator unchanged. Two additions, which real vLLM has no
counters for: `vllm:request_abort_total` counts requests aborted because their client
disconnected (vLLM's request_success_total{finished_reason="abort"} stays 0), and
`vllm:engine_busy_seconds_total` the engine time its steps took by the cost model (the
routing benchmark's measure of each instance's load).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.sim.engine import Engine

LABELS = ["engine", "model_name"]


class EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.values = ["0", engine.config.model]

    def collect(self) -> Iterator[Metric]:
        e, s, v = self.engine, self.engine.stats, self.values
        yield self._gauge(
            "num_requests_running", "Requests in the model execution batch.", len(e.running)
        )
        yield self._gauge(
            "num_requests_waiting", "Requests waiting to be processed.", len(e.waiting)
        )
        yield self._gauge(
            "kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            e.cache.used / e.cache.capacity,
        )
        yield self._counter(
            "prefix_cache_queries", "Prefix cache queries, in tokens.", s.prefix_queries
        )
        yield self._counter("prefix_cache_hits", "Prefix cache hits, in tokens.", s.prefix_hits)
        yield self._counter("prompt_tokens", "Prefill tokens processed.", s.prompt_tokens)
        yield self._counter(
            "generation_tokens", "Generation tokens processed.", s.generation_tokens
        )
        yield self._counter(
            "request_abort", "Requests aborted by a client disconnect (simulator).", s.aborted
        )
        yield self._counter(
            "engine_busy_seconds",
            "Seconds of engine steps, by the cost model (simulator).",
            s.busy_seconds,
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Successfully processed requests.",
            labels=[*LABELS, "finished_reason"],
        )
        for reason, count in s.finished.items():
            success.add_metric([*v, reason], count)
        yield success
        h = s.ttft
        cumulative, buckets = 0, []
        for bound, count in zip([*h.bounds, float("inf")], h.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        ttft = HistogramMetricFamily(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels=LABELS,
        )
        ttft.add_metric(v, buckets, h.total)
        yield ttft
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", *LABELS],
        )
        info.add_metric([str(e.config.block_size), str(e.config.cache_blocks), "True", *v], 1.0)
        yield info

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(f"vllm:{name}", doc, labels=LABELS)
        g.add_metric(self.values, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(f"vllm:{name}", doc, labels=LABELS)
        c.add_metric(self.values, value)
        return c


def registry_for(engine: Engine) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
