from gateway.backends import parse_engine_load

VLLM_METRICS = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 2.0
vllm:num_requests_running{engine="0",model_name="tiny"} 8.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1408.0
"""


def test_engine_gauges_summed_over_engines() -> None:
    assert parse_engine_load(VLLM_METRICS) == {
        "vllm:num_requests_waiting": 5.0,
        "vllm:num_requests_running": 8.0,
        "vllm:kv_cache_usage_perc": 0.25,
    }


def test_unlabelled_and_garbage_lines() -> None:
    assert parse_engine_load("vllm:num_requests_running 4\nvllm:kv_cache_usage_perc x\n") == {
        "vllm:num_requests_running": 4.0
    }


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
