"""One streamed request against a scripted SSE server: timing, usage, errors."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.bench.client import Target, TargetUnavailable, first_model, open_session, stream_chat
from gateway.bench.workloads import Turn
from tests.unit.bench.fake_backend import fake_backend

TURN = Turn("c0", 0, "", "hello there", 3)
BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "hello there"}],
    "max_tokens": 3,
    "stream": True,
}


def session(target: Target) -> aiohttp.ClientSession:
    return open_session(target, connections=2, timeout=10)


async def test_streamed_request_is_timed_and_its_usage_read() -> None:
    async with fake_backend() as fake:
        fake.delay = 0.02
        target = Target(fake.base_url, api_key="sk-x", headers={"x-team": "a"})
        async with session(target) as s:
            sample = await stream_chat(s, f"{fake.base_url}/chat/completions", BODY, TURN,
                                       {"x-session-id": "c0"})  # fmt: skip
    assert sample.error is None
    assert sample.answer == "a1.0 a1.1 a1.2 "
    assert sample.ttft is not None
    assert sample.ttft >= 0.015
    assert sample.latency is not None
    assert sample.latency >= sample.ttft + 0.03
    assert len(sample.gaps) == 2
    assert all(g >= 0.015 for g in sample.gaps)
    assert (sample.prompt_tokens, sample.cached_tokens, sample.completion_tokens) == (2, 1, 3)
    assert sample.instance == "fake-1"
    sent = fake.headers[0]
    assert sent["Authorization"] == "Bearer sk-x"
    assert sent["x-team"] == "a"
    assert sent["x-session-id"] == "c0"


async def test_missing_instance_header_is_unknown() -> None:
    async with fake_backend() as fake:
        url = fake.base_url.replace("/ok/", "/noheader/")
        async with session(Target(url)) as s:
            sample = await stream_chat(s, f"{url}/chat/completions", BODY, TURN)
    assert sample.error is None
    assert sample.instance == "unknown"


async def test_http_error_cut_or_malformed_stream_and_refused_connection() -> None:
    async with fake_backend() as fake:
        failing = fake.base_url.replace("/ok/", "/fail/")
        cut = fake.base_url.replace("/ok/", "/cut/")
        junk = fake.base_url.replace("/ok/", "/junk/")
        async with session(Target(failing)) as s:
            err = await stream_chat(s, f"{failing}/chat/completions", BODY, TURN)
            truncated = await stream_chat(s, f"{cut}/chat/completions", BODY, TURN)
            malformed = await stream_chat(s, f"{junk}/chat/completions", BODY, TURN)
        gone = fake.base_url
    async with session(Target(gone)) as s:
        refused = await stream_chat(s, f"{gone}/chat/completions", BODY, TURN)
    assert err.error == "HTTP 503"
    assert err.latency is None
    assert truncated.error == "IncompleteStream"
    assert malformed.error == "AttributeError"
    assert refused.error == "ClientConnectorError"


async def test_first_model_or_a_clear_error() -> None:
    async with fake_backend() as fake, session(Target(fake.base_url)) as s:
        assert await first_model(s, fake.base_url) == "fake-model"
        with pytest.raises(TargetUnavailable, match="cannot list models"):
            await first_model(s, fake.base_url.replace("/v1", "/nowhere"))
