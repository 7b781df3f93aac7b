"""The backend registry: which backends serve which model, and how loaded and healthy each is.

Load has two sources: calls in flight, counted here as the gateway dispatches them, and
what each vLLM engine says of itself (`vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`), scraped from its /metrics every second or so.

Health is a circuit breaker per backend (outlier ejection): a refused connection, a health
probe that fails or goes unanswered, or ``failure_threshold`` failed calls in a row
(reset, timed out, 5xx) eject the backend at once, and the calls still waiting on it for
their first byte are cut short, to be retried elsewhere. A model's last healthy backend
is ejected only by a refused connection (Envoy's panic threshold, in spirit). After
``ejection_time`` a good probe lets it back on probation (half-open): its first success
closes the circuit, its first failure ejects it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from gateway import upstream as http
from gateway.backlog import Backlog
from gateway.errors import BackendUnavailable, ModelNotFound
from gateway.metrics import GatewayMetrics
from gateway.settings import BackendSettings, ModelSettings, UpstreamSettings
from gateway.stages.routing import Candidate

log = logging.getLogger(__name__)

Circuit = Literal["closed", "open", "half_open"]
CIRCUIT_VALUE: dict[Circuit, int] = {"closed": 0, "open": 1, "half_open": 2}
"""The value of gateway_backend_circuit_state for each state."""


class Cut:
    """Lets a task's wait be interrupted from outside, told apart from any other
    cancellation: ``cut`` cancels the task; where it catches the CancelledError,
    ``caught`` says whether it was this cut (and undoes the cancellation if so).

    The bookkeeping of ``asyncio.timeout`` without its timer: it costs a call nothing
    beyond this object unless it is cut.
    """

    __slots__ = ("_cancelling", "_task", "reason")

    def __init__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self.reason: str | None = None

    def cut(self, reason: str) -> None:
        """Only while the task waits in the region this cut guards."""
        if self.reason is None:
            self.reason = reason
            self._task.cancel()

    def caught(self) -> bool:
        return self.reason is not None and self._task.uncancel() <= self._cancelling


@dataclass(slots=True, eq=False)
class Backend:
    name: str
    url: str
    """Base URL without /v1."""
    api_key: str | None = None
    weight: float = 1.0
    healthy: bool = True
    """Routable: the circuit is closed or half-open."""
    circuit: Circuit = "closed"
    failures: int = 0
    """Failed calls in a row (the circuit breaker's count)."""
    answered_at: float = 0.0
    """Monotonic time the backend last began an answer to a call: alive then."""
    ejected_until: float = 0.0
    """Monotonic time before which an ejected backend stays out whatever its probes say."""
    waits: set[Cut] = field(default_factory=set)
    """Calls waiting for their answer to begin: an ejection cuts them at once."""
    in_flight: int = 0
    waiting: int = 0
    """vLLM's own queue (`vllm:num_requests_waiting`), from the last scrape."""
    running: int = 0
    kv_usage: float = 0.0
    """vLLM's `vllm:kv_cache_usage_perc` (0..1), from the last scrape."""
    own_at_scrape: int = 0
    """This gateway's in-flight calls when the last scrape answered."""
    backlog: Backlog = field(default_factory=Backlog)
    """Our calls there, its learned rates and KV capacity: what the cost model reads."""

    @property
    def others(self) -> int:
        """Requests the engine runs or queues beyond this gateway's own (other replicas').

        Against our in-flight count at the scrape, not now: a second later our own calls
        have come and gone, and the difference would be phantom load.
        """
        return max(self.running + self.waiting - self.own_at_scrape, 0)

    def read_in_flight(self) -> int:
        """The in-flight count now: what a gauge read at scrape time calls."""
        return self.in_flight

    @classmethod
    def from_settings(cls, cfg: BackendSettings) -> Backend:
        url = cfg.url.rstrip("/").removesuffix("/v1")
        return cls(name=cfg.name or urlsplit(url).netloc, url=url, api_key=cfg.api_key,
                   weight=cfg.weight)  # fmt: skip


@dataclass(slots=True)
class Model:
    name: str
    upstream_name: str
    encoding: str
    backends: list[Backend] = field(default_factory=list)


PROBE_CONNECTIONS = 2
"""Connections each backend is probed on: its health and its load may be asked at once."""


class BackendPool:
    """Models and their backends; owns the health and load probing tasks."""

    def __init__(
        self,
        models: list[ModelSettings],
        upstream: UpstreamSettings,
        metrics: GatewayMetrics,
        on_capacity: Callable[[str, int], None] = lambda backend, tokens: None,
    ) -> None:
        """``on_capacity``: told each backend's KV capacity in tokens whenever a scrape
        reports it (the prefix index bounds the backend's handles by it)."""
        self._settings = upstream
        self._metrics = metrics
        self._on_capacity = on_capacity
        self.backends: dict[str, Backend] = {}
        self.models: dict[str, Model] = {}
        for m in models:
            model = Model(m.name, m.upstream_model or m.name, m.encoding)
            for b in m.backends:
                backend = Backend.from_settings(b)
                # A backend serving several models is one backend: one load, one health.
                backend = self.backends.setdefault(backend.name, backend)
                model.backends.append(backend)
            self.models[m.name] = model
        for backend in self.backends.values():
            metrics.watch_in_flight(backend.name, backend.read_in_flight)
            metrics.healthy.labels(backend.name).set(int(backend.healthy))
            metrics.circuit.labels(backend.name).set(CIRCUIT_VALUE[backend.circuit])
        self._tasks: list[asyncio.Task[None]] = []
        self._early: dict[str, asyncio.Task[None]] = {}
        """Per backend, the scrape due to tell whether calls wait for a slot there."""
        self._probes: dict[str, http.Pool] = {}
        """Per backend URL, the connections its health and load are asked on: apart from
        its calls', so a probe never waits behind them for a connection."""
        self._probing = False

    def model(self, name: str) -> Model:
        try:
            return self.models[name]
        except KeyError:
            raise ModelNotFound(f"The model `{name}` does not exist.", param="model") from None

    def candidates(self, model: Model, exclude: set[str]) -> list[Candidate]:
        """The model's backends as routing sees them, less those already tried.

        Load is this gateway's own in-flight count (exact, current) plus what the engine
        holds beyond it (other replicas' calls), from the last scrape. Adding the engine's
        whole queue instead would count our own calls twice, and with a second's lag.
        """
        slots = max(b.backlog.slots for b in model.backends)
        out = [
            Candidate(
                b.name,
                b.healthy,
                b.in_flight,
                b.others,
                b.kv_usage,
                b.weight,
                rates=b.backlog.rates,
                ahead=b.backlog.load(b.waiting, b.others + b.in_flight, b.kv_usage, slots),
            )
            for b in model.backends
            if b.name not in exclude
        ]
        if not any(c.healthy for c in out):
            raise BackendUnavailable(f"no healthy backend for model `{model.name}`")
        return out

    async def start(self) -> None:
        """Probe every backend once, then keep probing in the background."""
        self._probing = True
        await self.check_health()
        await self.scrape_load()
        self._tasks = [
            asyncio.create_task(self._every(self._settings.health_interval, self.check_health)),
            asyncio.create_task(self._every(self._settings.metrics_interval, self.scrape_load)),
        ]

    async def aclose(self) -> None:
        tasks = [*self._tasks, *self._early.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._probing = False
        for pool in self._probes.values():
            await pool.aclose()

    async def _every(self, interval: float, probe: Callable[[], Awaitable[None]]) -> None:
        """Probe every backend at once each interval: their answers arrive together and
        one turn of the event loop handles many, which costs less CPU than probes spread
        over the interval."""
        while True:
            await asyncio.sleep(interval)
            await probe()

    async def check_health(self) -> None:
        await asyncio.gather(*(self._check(b) for b in self.backends.values()))

    async def _check(self, backend: Backend) -> None:
        """Probe /health; a failed probe ejects the backend, with two exceptions for a
        saturated host, where /health answers late while calls still succeed. A probe left
        unanswered while the backend began answering a call is the host's lateness, not
        the backend's: ejecting it would pile its calls onto the others, as busy. And a
        late or unhealthy answer ejects a model's last healthy backend only if it refused
        the connection: ejecting the only backend would turn every call into a 503 until
        the next probe."""
        started = time.monotonic()
        refused = unanswered = False
        try:
            status, _ = await self._get(backend, "/health")
            ok = status == 200
        except http.ConnectError:
            ok, refused = False, True
        except (http.ClientError, TimeoutError):
            ok, unanswered = False, True
        if not ok:
            if unanswered and backend.answered_at >= started:
                return
            if refused or self._elsewhere(backend):
                self.eject(backend, "probe")
        elif backend.circuit == "open" and time.monotonic() >= backend.ejected_until:
            log.warning("backend %s answers its probe again: back on probation", backend.name)
            backend.failures = self._settings.failure_threshold - 1
            self._set(backend, "half_open")

    async def _get(self, backend: Backend, path: str) -> tuple[int, bytes]:
        """GET ``path`` from the backend: the answer's status and body, within
        ``health_timeout`` in all. Raises the HTTP client's errors or TimeoutError."""
        pool = self._probes.get(backend.url)
        if pool is None:
            pool = self._probes[backend.url] = http.Pool(
                backend.url, limit=PROBE_CONNECTIONS, connect_timeout=self._settings.health_timeout
            )
        async with asyncio.timeout(self._settings.health_timeout):
            resp = await pool.request(path, b"", (), self._settings.health_timeout, "GET")
            try:
                body = await resp.read()
            except BaseException:
                resp.close()
                raise
        resp.release()
        return resp.status, body

    def succeeded(self, backend: Backend) -> None:
        """A call got its answer from the backend: its failure count starts over."""
        backend.answered_at = time.monotonic()
        if backend.failures:
            backend.failures = 0
            if backend.circuit == "half_open":
                log.warning("backend %s passed its probation: healthy", backend.name)
                self._set(backend, "closed")

    def failed(self, backend: Backend, at_once: bool = False) -> None:
        """A call failed on the backend; enough in a row (or one ``at_once``) eject it.

        Failed calls eject a backend only while another can take its calls: ejecting a
        model's last backend for errors would turn each call that might still succeed
        into a 503 for ``ejection_time`` (Envoy's panic threshold, in spirit). A refused
        connection ejects it regardless: it answers nothing anyway.
        """
        backend.failures += 1
        if at_once:
            self.eject(backend, "unreachable")
        elif backend.failures >= self._settings.failure_threshold and self._elsewhere(backend):
            self.eject(backend, "failures")

    def eject(self, backend: Backend, reason: str) -> None:
        """Take the backend out and cut the waits of its calls, if another can take them.

        Ejected by failed calls, it stays out ``ejection_time``; by a failed probe, until a
        probe succeeds (the probe is itself the evidence: a backend whose /health answered
        late once, on a saturated host, is back at the next probe, not seconds later).
        Its calls' waits are cut only when a backend sharing a model with it is healthy:
        with nowhere else to go, cutting them would fail calls that may yet be answered.
        """
        hold = 0.0 if reason == "probe" else self._settings.ejection_time
        backend.ejected_until = max(backend.ejected_until, time.monotonic() + hold)
        if backend.circuit == "open":
            return
        log.warning("backend %s ejected (%s)", backend.name, reason)
        self._set(backend, "open")
        self._metrics.ejections.labels(backend.name, reason).inc()
        if not self._elsewhere(backend):
            return
        for wait in list(backend.waits):
            wait.cut("ejected")

    def _elsewhere(self, backend: Backend) -> bool:
        """Whether a healthy backend serves one of this one's models."""
        return any(
            other.healthy
            for model in self.models.values()
            if backend in model.backends
            for other in model.backends
            if other is not backend
        )

    def _set(self, backend: Backend, circuit: Circuit) -> None:
        backend.circuit = circuit
        backend.healthy = circuit != "open"
        self._metrics.healthy.labels(backend.name).set(int(backend.healthy))
        self._metrics.circuit.labels(backend.name).set(CIRCUIT_VALUE[circuit])

    async def scrape_load(self) -> None:
        await asyncio.gather(*(self._scrape(b) for b in self.backends.values() if b.healthy))

    async def _scrape(self, backend: Backend) -> None:
        try:
            status, data = await self._get(backend, "/metrics")
        except (http.ClientError, TimeoutError):
            return
        if status != 200:
            return
        load = parse_scrape(data)
        backend.waiting = load.waiting
        backend.running = load.running
        backend.kv_usage = load.kv_usage
        backend.own_at_scrape = backend.in_flight
        capacity = load.capacity_tokens
        backend.backlog.scraped(capacity, backend.running, backend.waiting)
        if capacity:
            self._on_capacity(backend.name, capacity)
        delay = backend.backlog.confirm_after(backend.waiting)
        if delay is not None:
            self.scrape_after(backend, delay)

    def admitted(self, backend: Backend) -> None:
        """A call was just counted into the backend's backlog: scrape early if it may wait
        for a slot not known to be full (:meth:`gateway.backlog.Backlog.ask_after`)."""
        delay = backend.backlog.ask_after(self._settings.metrics_interval)
        if delay is not None:
            self.scrape_after(backend, delay)

    def scrape_after(self, backend: Backend, delay: float) -> None:
        """Scrape the backend in ``delay`` seconds, once the prefill queued there is done,
        to tell whether calls wait for a slot (:meth:`gateway.backlog.Backlog.confirm_after`,
        :meth:`~gateway.backlog.Backlog.ask_after`); not if the regular scrape comes first,
        another is due already, or load is not scraped. Asked from such a scrape (a
        first look that found calls waiting at the peak), it is that scrape's sequel."""
        due = self._early.get(backend.name)
        if delay >= self._settings.metrics_interval or due not in (None, asyncio.current_task()):
            return
        if self._probing:
            self._early[backend.name] = asyncio.create_task(self._scrape_later(backend, delay))

    async def _scrape_later(self, backend: Backend, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            await self._scrape(backend)
        finally:
            if self._early.get(backend.name) is asyncio.current_task():
                del self._early[backend.name]


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What routing reads from an engine's /metrics, summed over its engines."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    capacity_tokens: int | None = None
    """KV capacity, ``num_gpu_blocks x block_size`` from ``vllm:cache_config_info``;
    None when the engine does not export it."""


SERIES = (b"vllm:num_requests_waiting", b"vllm:num_requests_running",
          b"vllm:kv_cache_usage_perc", b"vllm:cache_config_info")  # fmt: skip
LABEL = re.compile(rb'(\w+)="([^"]*)"')


def parse_scrape(data: bytes) -> EngineLoad:
    """The load gauges and KV capacity from Prometheus text, read from the undecoded bytes.

    vLLM's /metrics runs to hundreds of lines (tens of KB of histogram buckets), scraped
    every second per backend, and these four series are all routing needs: each is found
    with ``bytes.find`` (a C scan), so no Python code runs per line that is not one of them.
    """
    data = b"\n" + data
    sums: dict[bytes, float] = {}
    capacity = 0
    for name in SERIES:
        for labels, value in _samples(data, name):
            if name == b"vllm:cache_config_info":
                info = dict(LABEL.findall(labels))
                with contextlib.suppress(KeyError, ValueError):
                    capacity += int(info[b"num_gpu_blocks"]) * int(info[b"block_size"])
                continue
            with contextlib.suppress(ValueError):
                sums[name] = sums.get(name, 0.0) + float(value)
    return EngineLoad(
        waiting=int(sums.get(b"vllm:num_requests_waiting", 0)),
        running=int(sums.get(b"vllm:num_requests_running", 0)),
        kv_usage=sums.get(b"vllm:kv_cache_usage_perc", 0.0),
        capacity_tokens=capacity or None,
    )


def _samples(data: bytes, name: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(labels, value) of each sample of the series ``name`` (not of a longer name that
    starts with it); ``data`` starts with a newline."""
    needle = b"\n" + name
    at = data.find(needle)
    while at != -1:
        end = data.find(b"\n", at + 1)
        rest = data[at + len(needle) : end if end != -1 else len(data)]
        at = data.find(needle, at + 1)
        if rest[:1] == b"{":
            labels, _, value = rest[1:].rpartition(b"} ")
        elif rest[:1] == b" ":
            labels, value = b"", rest[1:]
        else:
            continue
        yield labels, value.strip().partition(b" ")[0]
