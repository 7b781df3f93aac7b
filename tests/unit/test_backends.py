import asyncio

import pytest
from prometheus_client import CollectorRegistry

from gateway.backends import PROBE_CONNECTIONS, BackendPool, EngineLoad, parse_scrape
from gateway.errors import BackendUnavailable
from gateway.flow import Call, Request, Route
from gateway.metrics import GatewayMetrics
from gateway.settings import load_settings
from tests.unit import loopback

VLLM_METRICS = b"""# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 2.0
vllm:num_requests_running{engine="0",model_name="tiny"} 8.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1408.0
"""


def test_engine_gauges_summed_over_engines() -> None:
    assert parse_scrape(VLLM_METRICS) == EngineLoad(waiting=5, running=8, kv_usage=0.25)


def test_unlabelled_and_garbage_lines() -> None:
    text = b"vllm:num_requests_running 4\nvllm:kv_cache_usage_perc x\nvllm:num_requests_waiting\n"
    assert parse_scrape(text) == EngineLoad(running=4)


def test_engine_load_beyond_our_own_calls_is_what_routing_adds() -> None:
    from gateway.backends import Backend

    b = Backend(name="b", url="http://b", in_flight=5, running=4, waiting=3, own_at_scrape=5)
    assert b.others == 2  # 7 at the engine when scraped, 5 of them ours
    # Our own calls come and go between scrapes: neither is another replica's load.
    b.in_flight = 0
    assert b.others == 2
    b.in_flight = 9
    assert b.others == 2
    b.own_at_scrape = 9
    assert b.others == 0


def pool_of(urls: list[str], **upstream: object) -> tuple[BackendPool, GatewayMetrics]:
    settings = load_settings(
        models=[loopback.model(urls)],
        upstream={"health_interval": 60, "health_timeout": 0.3, **upstream},
    )
    metrics = GatewayMetrics(CollectorRegistry())
    return BackendPool(settings.models, settings.upstream, metrics), metrics


def circuit(metrics: GatewayMetrics, backend: str) -> tuple[float, float]:
    """(gateway_backend_circuit_state, gateway_backend_healthy) as exported."""
    return (
        metrics.circuit.labels(backend)._value.get(),
        metrics.healthy.labels(backend)._value.get(),
    )


async def test_failures_in_a_row_eject_and_a_success_starts_the_count_over() -> None:
    pool, metrics = pool_of(["http://127.0.0.1:1", "http://127.0.0.1:2"], failure_threshold=3)
    b = pool.backends["b0"]
    pool.failed(b)
    pool.failed(b)
    pool.succeeded(b)
    pool.failed(b)
    pool.failed(b)
    assert (b.circuit, b.healthy, circuit(metrics, "b0")) == ("closed", True, (0, 1))
    pool.failed(b)
    assert (b.circuit, b.healthy, circuit(metrics, "b0")) == ("open", False, (1, 0))
    assert metrics.ejections.labels("b0", "failures")._value.get() == 1
    assert [c.name for c in pool.candidates(pool.model("m"), set()) if c.healthy] == ["b1"]


async def test_failed_calls_never_eject_a_models_last_backend_but_refusals_do() -> None:
    pool, metrics = pool_of(["http://127.0.0.1:1"], failure_threshold=1)
    b = pool.backends["b0"]
    pool.failed(b)
    pool.failed(b)
    assert (b.circuit, b.failures) == ("closed", 2)
    pool.failed(b, at_once=True)
    assert b.circuit == "open"
    assert metrics.ejections.labels("b0", "unreachable")._value.get() == 1
    with pytest.raises(BackendUnavailable):
        pool.candidates(pool.model("m"), set())


async def test_a_hung_probe_ejects_until_a_good_one_readmits_on_probation() -> None:
    async with loopback.backends("hang", "ok") as (hung, ok):
        pool, metrics = pool_of([hung.url, ok.url], ejection_time=0.2, failure_threshold=3)
        await pool.start()
        try:
            b0, b1 = pool.backends["b0"], pool.backends["b1"]
            assert (b0.circuit, b1.circuit) == ("open", "closed")  # the hung probe timed out
            assert metrics.ejections.labels("b0", "probe")._value.get() == 1
            b0.url = ok.url  # the backend recovers: the next good probe lets it back
            await pool.check_health()
            assert (b0.circuit, b0.healthy, circuit(metrics, "b0")) == ("half_open", True, (2, 1))
            pool.failed(b0)  # on probation, the first failure ejects again...
            assert (b0.circuit, b0.healthy) == ("open", False)
            await pool.check_health()
            # ... for ejection_time, whatever the probes say
            assert (b0.circuit, b0.healthy) == ("open", False)
            await asyncio.sleep(0.25)
            await pool.check_health()
            assert (b0.circuit, b0.healthy) == ("half_open", True)
            pool.succeeded(b0)  # the first success closes the circuit
            assert (b0.circuit, circuit(metrics, "b0")) == ("closed", (0, 1))
            pool.failed(b0)
            assert b0.circuit == "closed"
        finally:
            await pool.aclose()


async def test_probes_ask_health_and_load_on_connections_kept_open() -> None:
    async with loopback.backends("ok") as (ok,):
        ok.metrics = VLLM_METRICS
        pool, _ = pool_of([ok.url])
        await pool.start()
        try:
            for _ in range(10):
                await asyncio.gather(pool.check_health(), pool.scrape_load())
            b0 = pool.backends["b0"]
            assert (b0.healthy, b0.waiting, b0.running) == (True, 5, 8)
            assert len(ok.scrapes) == 11
            assert ok.requests == 11  # the health probes
            assert 1 <= ok.connections <= PROBE_CONNECTIONS
        finally:
            await pool.aclose()


async def test_a_late_probe_never_ejects_a_models_last_backend_but_a_refusal_does() -> None:
    async with loopback.backends("hang") as (hung,):
        pool, metrics = pool_of([hung.url])
        await pool.start()
        try:
            b0 = pool.backends["b0"]
            assert (b0.circuit, b0.healthy) == ("closed", True)  # late, but the only one
            assert metrics.ejections.labels("b0", "probe")._value.get() == 0
            b0.url = "http://127.0.0.1:1"  # nothing listens: the connection is refused
            await pool.check_health()
            assert b0.circuit == "open"
        finally:
            await pool.aclose()


async def test_a_probe_left_unanswered_while_calls_are_answered_does_not_eject() -> None:
    """A saturated host answers /health late while the backend still answers calls: that
    backend stays in. Once it answers nothing, the next late probe ejects it."""
    async with loopback.backends("hang", "ok") as (hung, ok):
        pool, metrics = pool_of([hung.url, ok.url])
        await pool.start()
        try:
            b0 = pool.backends["b0"]  # ejected by its first probe: let it back
            b0.url = ok.url
            await pool.check_health()
            pool.succeeded(b0)
            assert b0.circuit == "closed"
            b0.url = hung.url

            async def answered_meanwhile() -> None:
                await asyncio.sleep(0.1)
                pool.succeeded(b0)

            await asyncio.gather(pool.check_health(), answered_meanwhile())
            assert (b0.circuit, b0.healthy) == ("closed", True)
            await pool.check_health()  # no call answered during this one
            assert (b0.circuit, b0.healthy) == ("open", False)
            assert metrics.ejections.labels("b0", "probe")._value.get() == 2
        finally:
            await pool.aclose()


async def test_calls_waiting_at_the_peak_are_scraped_again_before_the_interval_ends() -> None:
    """A burst that fills the slots for less than two scrape intervals would otherwise
    pass unseen: the second look comes once the prefill queued there is done."""
    full = b"vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n"
    async with loopback.backends("ok", "ok") as (saturated, idle):
        saturated.metrics = full
        idle.metrics = b"vllm:num_requests_running 2\nvllm:num_requests_waiting 0\n"
        pool, _ = pool_of([saturated.url, idle.url], metrics_interval=30)
        await pool.start()
        try:
            b0 = pool.backends["b0"]
            for _ in range(100):
                if b0.backlog.slots:
                    break
                await asyncio.sleep(0.01)
            assert b0.backlog.slots == 2
            assert len(saturated.scrapes) == 2
            assert saturated.scrapes[1] - saturated.scrapes[0] < 1.0
            assert len(idle.scrapes) == 1  # nothing waiting there: nothing to confirm
        finally:
            await pool.aclose()


async def test_a_call_beyond_the_engines_peak_has_it_scraped_before_the_interval_ends() -> None:
    """Sent while more of ours are in flight than the engine was seen running, a call may
    wait for a slot: the pool looks at once the prefill queued there is done, and two
    looks that find calls waiting at the peak tell the slot count."""
    async with loopback.backends("ok") as (engine,):
        engine.metrics = b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
        pool, _ = pool_of([engine.url], metrics_interval=30)
        await pool.start()
        try:
            b0 = pool.backends["b0"]
            engine.metrics = b"vllm:num_requests_running 1\nvllm:num_requests_waiting 1\n"
            for i in range(2):
                c = Call(id=f"c{i}", path="/v1/chat/completions")
                c.route, c.dispatched_at = Route(backend="b0"), c.received_at
                b0.backlog.admit(c)
            delay = b0.backlog.ask_after(interval=0.0)
            assert delay is not None
            pool.scrape_after(b0, delay)
            for _ in range(100):
                if b0.backlog.slots:
                    break
                await asyncio.sleep(0.01)
            assert b0.backlog.slots == 1
            assert len(engine.scrapes) == 3  # the regular one, the one asked, its confirmation
        finally:
            await pool.aclose()


def test_a_backend_whose_slots_are_unknown_is_costed_at_its_peers() -> None:
    pool, _ = pool_of(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    b0, b1 = pool.backends["b0"], pool.backends["b1"]
    for _ in range(2):
        b0.backlog.scraped(None, running=1, waiting=1)
    assert (b0.backlog.slots, b1.backlog.slots) == (1, 0)
    b1.backlog.rates.per_output = 0.1
    c = Call(id="c", path="/v1/chat/completions")
    c.request = Request(endpoint="chat", model="m", body={}, stream=True, max_tokens=10)
    c.route = Route(backend="b1", uncached_tokens=0, expected_ttft=0.1)
    c.dispatched_at = c.first_byte_at = c.received_at
    b1.backlog.admit(c)
    b1.in_flight = 1
    ahead = {cand.name: cand.ahead for cand in pool.candidates(pool.model("m"), set())}
    assert ahead["b1"].slot_wait == pytest.approx(1.0, abs=0.05)  # its one slot is taken
    assert ahead["b0"].slot_wait == 0.0


def test_kv_capacity_is_blocks_times_block_size_summed_over_engines() -> None:
    text = (
        b"# TYPE vllm:cache_config_info gauge\n"
        b'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",'
        b'num_gpu_blocks="1000"} 1.0\n'
        b'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="500"} 1.0\n'
    )
    assert parse_scrape(text).capacity_tokens == 24_000
    assert parse_scrape(VLLM_METRICS).capacity_tokens is None
    assert parse_scrape(b'vllm:cache_config_info{block_size="x"} 1.0\n').capacity_tokens is None
