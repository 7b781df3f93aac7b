"""Metrics, aborts, errors and the endpoints peer routers probe."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.sim import RunningSimulator
from tests.e2e.sim.conftest import StartSim, client_for, scrape

LABELS = '{engine="0",model_name="sim"}'
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
CHAT = {"model": "sim", "messages": MESSAGES}


async def test_metrics_parse_with_vllm_names(start_sim: StartSim) -> None:
    sim = await start_sim(step_ms=1.0)
    async with client_for(sim) as client:
        await client.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=3)
    samples = await scrape(sim)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_abort_total",
        "vllm:time_to_first_token_seconds_count",
    ):
        assert name in samples, name
    assert samples["vllm:generation_tokens_total"] == 3
    # By the cost model: three steps at 1 ms, the prompt's prefill at 0.1 ms a token, and
    # the one sequence decoding in the last two steps at 0.05 ms each.
    busy_ms = 3 * 1.0 + 0.1 * samples["vllm:prompt_tokens_total"] + 2 * 0.05
    assert samples["vllm:engine_busy_seconds_total"] == pytest.approx(busy_ms / 1000)
    assert samples["vllm:prompt_tokens_total"] == samples["vllm:prefix_cache_queries_total"] > 0
    assert samples["vllm:time_to_first_token_seconds_count"] == 1
    async with httpx.AsyncClient() as http:
        text = (await http.get(sim.url + "/metrics")).text
    assert f"vllm:num_requests_running{LABELS}" in text
    assert 'le="0.001"' in text
    assert 'le="2560.0"' in text


async def poll_aborts(sim: RunningSimulator, expected: float) -> dict[str, float]:
    """Metrics once the abort count reached expected and nothing runs (vLLM: within 0.2 s)."""
    samples: dict[str, float] = {}
    for _ in range(250):
        samples = await scrape(sim)
        if (
            samples["vllm:request_abort_total"] == expected
            and samples["vllm:num_requests_running"] == 0
        ):
            return samples
        await asyncio.sleep(0.02)
    raise AssertionError(f"aborts never reached {expected}: {samples}")


async def test_a_disconnected_stream_is_aborted_and_frees_its_blocks(start_sim: StartSim) -> None:
    sim = await start_sim(step_ms=2.0)
    body = {**CHAT, "max_tokens": 5000, "stream": True}
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", sim.url + "/v1/chat/completions", json=body) as r,
    ):
        async for _ in r.aiter_lines():
            break
    samples = await poll_aborts(sim, 1)
    assert samples["vllm:kv_cache_usage_perc"] == 0
    assert samples["vllm:generation_tokens_total"] < 5000


async def test_a_client_gone_before_a_plain_answer_is_aborted(start_sim: StartSim) -> None:
    sim = await start_sim(step_ms=2.0)
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                sim.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 5000}, timeout=0.3
            )
    await poll_aborts(sim, 1)


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({"model": "sim"}, 400, "Bad Request"),  # FastAPI's validation, as vLLM words it
        ({**CHAT, "max_tokens": 0}, 400, "BadRequestError"),
        ({**CHAT, "max_completion_tokens": -1}, 400, "BadRequestError"),
        (
            {**CHAT, "messages": [{"role": "user", "content": "word " * 300}]},
            400,
            "BadRequestError",
        ),
        ({**CHAT, "max_tokens": 1000}, 400, "BadRequestError"),
        ({**CHAT, "model": "other"}, 404, "NotFoundError"),
    ],
)
async def test_bad_requests_get_vllm_error_shape(
    start_sim: StartSim, body: dict[str, object], status: int, kind: str
) -> None:
    sim = await start_sim(max_model_len=256)
    async with httpx.AsyncClient() as http:
        r = await http.post(sim.url + "/v1/chat/completions", json=body)
    assert r.status_code == status
    assert r.headers["x-backend-instance"] == sim.name
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind
    assert error["code"] == status
    assert error["message"]


async def test_an_output_limit_past_the_context_end_is_cut_to_fit(start_sim: StartSim) -> None:
    # vLLM 0.32 refuses only a max_tokens above max_model_len; otherwise it stops the
    # answer where the context ends.
    sim = await start_sim(max_model_len=256, step_ms=0.0)
    async with httpx.AsyncClient() as http:
        r = await http.post(sim.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 250})
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == 256


async def test_a_body_that_is_not_json_is_refused_as_fastapi_does(start_sim: StartSim) -> None:
    sim = await start_sim()
    async with httpx.AsyncClient() as http:
        r = await http.post(sim.url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", "body.1", 400)
    assert "Expecting property name enclosed in double quotes" in error["message"]


async def test_the_official_client_raises_its_own_error_types(start_sim: StartSim) -> None:
    sim = await start_sim()
    async with client_for(sim) as client:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=MESSAGES)
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model="sim", prompt="x", max_tokens=0)


async def test_peer_router_probes_answer(start_sim: StartSim) -> None:
    sim = await start_sim()
    async with httpx.AsyncClient(base_url=sim.url) as http:
        tok = (await http.post("/tokenize", json=CHAT)).json()
        render = (await http.post("/v1/chat/completions/render", json=CHAT)).json()
        assert tok["count"] == len(tok["tokens"]) > 0
        assert render["token_ids"] == tok["tokens"]
        plain = (await http.post("/tokenize", json={"prompt": "hello world"})).json()
        assert plain["count"] == 2
        assert (await http.get("/version")).json() == {"version": "0.32.0+sim"}
        for path in ("/health", "/health_generate", "/ping", "/server_info", "/get_server_info"):
            assert (await http.get(path)).status_code == 200, path
        for path in ("/model_info", "/get_model_info"):
            assert (await http.get(path)).json()["model_path"] == "sim"
        info = (await http.get("/get_server_info")).json()
        assert info["page_size"] == 16
        assert info["max_total_num_tokens"] == 8192 * 16


async def test_instant_streams_parse_like_scheduled_ones(start_sim: StartSim) -> None:
    instant, scheduled = await start_sim(instant=True), await start_sim(step_ms=1.0)
    texts = []
    for sim in (instant, scheduled):
        async with client_for(sim) as client:
            stream = await client.chat.completions.create(
                model="sim",
                messages=MESSAGES,
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 5
        texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    assert texts[0] == texts[1]
    assert texts[0]
