"""The gateway's Prometheus metrics, defined on an injected registry.

Names follow Prometheus conventions (base units, ``_total`` only on counters); labels are
low-cardinality (model, backend, endpoint, status, decision), never a key or a prompt.
Where vLLM exports the same histogram, the buckets are vLLM's, so gateway and engine
panels line up in Grafana.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from gateway.flow import ENDPOINTS, Call

M = TypeVar("M", bound=MetricWrapperBase)

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), so the panels line up.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
CONNECT_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
)  # fmt: skip


@dataclass(slots=True, frozen=True)
class CallSeries:
    """The series one (model, backend, endpoint, stream) combination records into,
    resolved once: a finished call updates them without a label lookup each."""

    ttft: Histogram
    tpot: Histogram
    e2e: Histogram
    overhead: Histogram
    prompt: Counter
    cached: Counter
    completion: Counter
    predicted_cached: Counter
    reported_cached: Counter


class GatewayMetrics:
    """Every metric the gateway records, created once per app on its registry.

    Gauges name a ``multiprocess_mode`` for `gateway serve --workers N`, where each worker
    writes its own values and a scrape merges them: in-flight counts add up, a backend
    counts as healthy only if every worker sees it so, and the index size is the last
    one measured. ``multiprocess`` tells which: a ``set_function`` callback is free on
    the request path but no other process can see it.
    """

    def __init__(self, registry: CollectorRegistry, multiprocess: bool = False) -> None:
        """Long, but a list rather than logic: one declaration per metric, all in one place,
        where a reader (and the README's metric table) finds every name and label."""
        self.registry = registry
        self.multiprocess = multiprocess
        self._added: dict[Counter, float] = {}
        """What ``add`` counted since the registry was last collected, by series."""
        self.add: Callable[[Counter, float], None] = Counter.inc if multiprocess else self._defer
        """Count into a series (a counter's child). With one process, at the next
        collection of the registry: a dict update instead of the client library's locked
        increment, for the half-dozen counts every call makes; any collection (a scrape, a
        test's ``get_sample_value``) adds them first, as this registers itself before
        every metric. With several, at once: another worker's scrape must see them."""
        registry.register(Added(self))
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}
        self._series: dict[tuple[str, str, str, str], CallSeries] = {}
        call = ["model", "backend", "endpoint", "stream"]
        self.requests = Counter(
            "gateway_requests_total",
            "Calls finished, by outcome.",
            ["model", "endpoint", "status", "error_type"],
            registry=registry,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from receiving the call to the first byte of the backend's answer.",
            call,
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "gateway_time_per_output_token_seconds",
            "Mean time between output tokens of a streamed call (after the first).",
            call,
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            "gateway_request_duration_seconds",
            "Time from receiving the call to its last byte.",
            call,
            buckets=E2E_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Time spent in the gateway itself: before dispatch, plus after the whole body "
            "arrived for a non-streamed call (also sent as x-gateway-overhead-ms).",
            call,
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.connect = Histogram(
            "gateway_upstream_connect_seconds",
            "Time to open a new connection to a backend (reused connections are not counted).",
            ["backend"],
            buckets=CONNECT_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "gateway_tokens_total",
            "Tokens by kind: prompt (all input), cached (input served from KV cache), completion.",
            ["model", "backend", "kind"],
            registry=registry,
        )
        self.routing = Counter(
            "gateway_routing_decisions_total",
            "Routing outcomes: hit, miss, overflow, affinity, fallback.",
            ["model", "decision"],
            registry=registry,
        )
        self.predicted_cached = Counter(
            "gateway_predicted_cached_tokens_total",
            "Prompt tokens the index predicted the chosen backend holds (gateway tokens).",
            ["model"],
            registry=registry,
        )
        self.reported_cached = Counter(
            "gateway_reported_cached_tokens_total",
            "Cached prompt tokens the backends reported (backend tokens).",
            ["model"],
            registry=registry,
        )
        self.prediction = Counter(
            "gateway_cache_predictions_total",
            "Calls by how the index's predicted cached share of the prompt compared with the "
            "backend's reported share: accurate (within 0.1), over, under.",
            ["model", "outcome"],
            registry=registry,
        )
        self.disconnects = Counter(
            "gateway_client_disconnects_total",
            "Calls whose client went away before the answer was complete.",
            ["model", "endpoint"],
            registry=registry,
        )
        self.retries = Counter(
            "gateway_upstream_retries_total",
            "Calls re-sent to another backend after theirs failed before the client was sent "
            "anything (refused, reset, timed out, 5xx, or ejected while waiting).",
            ["model"],
            registry=registry,
        )
        self.batched = Counter(
            "gateway_batched_requests_total",
            "Calls answered without an upstream call of their own: coalesced onto an "
            "identical call, sent in a micro-batch, or held for a warm prefix.",
            ["model", "endpoint", "mechanism"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "gateway_backend_in_flight_requests",
            "Calls in flight per backend.",
            ["backend"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.healthy = Gauge(
            "gateway_backend_healthy",
            "1 when the backend takes calls: its circuit is closed or half-open.",
            ["backend"],
            registry=registry,
            multiprocess_mode="livemin",
        )
        self.circuit = Gauge(
            "gateway_backend_circuit_state",
            "The backend's circuit breaker: 0 closed, 1 open (ejected), 2 half-open "
            "(back on probation after its ejection).",
            ["backend"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.ejections = Counter(
            "gateway_backend_ejections_total",
            "Backends taken out by the circuit breaker, by cause: unreachable (refused "
            "connection), probe (health probe failed or unanswered), failures (failed calls "
            "in a row).",
            ["backend", "reason"],
            registry=registry,
        )
        self.index_size = Gauge(
            "gateway_prefix_index_handles",
            "Live prefill-state handles in the prefix index, measured at scrape time.",
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.python_blocks = Gauge(
            "gateway_python_allocated_blocks",
            "Blocks Python's allocator holds for live objects in this process, measured at "
            "scrape time: a heap that keeps growing shows here before it shows as RSS.",
            registry=registry,
            multiprocess_mode="liveall",
        )

    def _defer(self, counter: Counter, amount: float) -> None:
        self._added[counter] = self._added.get(counter, 0.0) + amount

    def flush(self) -> None:
        """Add what ``add`` deferred to its series."""
        added, self._added = self._added, {}
        for counter, amount in added.items():
            counter.inc(amount)

    def child(self, metric: M, *values: str) -> M:
        """``metric.labels(*values)``, remembered.

        labels() validates and takes a lock, and a call records a dozen series;
        this is one dict lookup. Label values are bounded (configured models and backends,
        endpoints, statuses, error classes), so the cache is too.
        """
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return cast(M, found)  # the key holds the metric, so this is a child of its type

    def series(self, model: str, backend: str, endpoint: str, stream: str) -> CallSeries:
        """The per-call series of this combination (label values bounded as in child)."""
        key = (model, backend, endpoint, stream)
        found = self._series.get(key)
        if found is None:
            call, tokens = key, (model, backend)
            found = self._series[key] = CallSeries(
                ttft=self.ttft.labels(*call),
                tpot=self.tpot.labels(*call),
                e2e=self.e2e.labels(*call),
                overhead=self.overhead.labels(*call),
                prompt=self.tokens.labels(*tokens, "prompt"),
                cached=self.tokens.labels(*tokens, "cached"),
                completion=self.tokens.labels(*tokens, "completion"),
                predicted_cached=self.predicted_cached.labels(model),
                reported_cached=self.reported_cached.labels(model),
            )
        return found

    def watch_in_flight(self, backend: str, read: Callable[[], int]) -> None:
        """Report a backend's in-flight count: read at scrape time in one process; with
        several, each worker counts its own calls in and out (see ``count_in_flight``)."""
        gauge = self.in_flight.labels(backend)
        if self.multiprocess:
            gauge.set(0)
        else:
            gauge.set_function(read)

    def count_in_flight(self, backend: str, delta: int) -> None:
        if self.multiprocess:
            self.child(self.in_flight, backend).inc(delta)

    def observe(self, call: Call, models: Collection[str]) -> None:
        """Count a finished call and observe its timings and tokens, under labels a client
        cannot invent: a model not in ``models`` is counted as ""."""
        req = call.request
        model = req.model if req and req.model in models else ""
        endpoint = req.endpoint if req else ENDPOINTS.get(call.path, "")
        add = self.add
        add(self.child(self.requests, model, endpoint, str(call.status), call.error_type or ""), 1)
        if req is None or call.route is None:
            return
        route, u = call.route, call.usage
        s = self.series(model, route.backend, endpoint, "true" if req.stream else "false")
        if route.decision != "none":
            add(self.child(self.routing, model, route.decision), 1)
        if call.served_by != "upstream":
            add(self.child(self.batched, model, endpoint, call.served_by), 1)
        if call.disconnected:
            add(self.child(self.disconnects, model, endpoint), 1)
        if call.overhead is not None:
            s.overhead.observe(call.overhead)
        if call.latency is not None:
            s.e2e.observe(call.latency)
        if req.stream and call.ttft is not None:
            s.ttft.observe(call.ttft)
        if u is None:
            return
        if req.stream and call.first_byte_at and call.done_at and u.completion_tokens > 1:
            s.tpot.observe((call.done_at - call.first_byte_at) / (u.completion_tokens - 1))
        add(s.prompt, u.prompt_tokens)
        add(s.completion, u.completion_tokens)
        if u.cached_tokens:  # the series exist from the call's first: nothing to add
            add(s.cached, u.cached_tokens)
        if not u.estimated:
            if route.predicted_cached_tokens:
                add(s.predicted_cached, route.predicted_cached_tokens)
            if u.cached_tokens:
                add(s.reported_cached, u.cached_tokens)


class Added:
    """A collector of nothing, first in the registry: collecting it adds the counts
    ``GatewayMetrics.add`` deferred, before the metrics that hold them are read."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        self._metrics.flush()
        return iter(())


def render(registry: CollectorRegistry, multiproc_dir: Path | None) -> bytes:
    """The exposition text. With several workers, every worker's values merged from the
    shared directory, so whichever worker answers the scrape reports the same totals."""
    if multiproc_dir is None:
        return generate_latest(registry)
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=str(multiproc_dir))
    return generate_latest(merged)


def release_process(multiproc_dir: Path) -> None:
    """A worker that stops takes its live gauges (in flight, health, ledger queue) out of
    the merged view; its counters stay, so totals never go backwards."""
    mark_process_dead(os.getpid(), str(multiproc_dir))
