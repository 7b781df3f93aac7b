"""The gateway in front of two real vLLM servers, driven with the official openai client.

Each answer is checked against what vLLM itself says for the same request sent to it
directly: the random model is deterministic at temperature 0, so text and token counts
must match exactly.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.vllm.conftest import metric

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(120, func_only=True)]

GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about prefix caching."}
]
PROMPT = "def prefix_cache(blocks):"


@pytest.fixture
def client(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def direct(vllm_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM answers to the request when no gateway is in between."""
    extra = body.pop("extra_body", {})
    r = httpx.post(vllm_url + path, json={"model": "tiny", **body, **extra}, timeout=30)
    r.raise_for_status()
    answer: dict[str, Any] = r.json()
    return answer


def test_chat_matches_vllm(client: openai.OpenAI, vllm_urls: list[str]) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, **GREEDY
    )
    got = raw.parse()
    want = direct(vllm_urls[0], "/v1/chat/completions", {"messages": MESSAGES, **GREEDY})
    assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert got.choices[0].finish_reason == "length"
    # Every usage field as vLLM reported it, its extras (created_cache_tokens) included.
    assert raw.http_response.json()["usage"] == want["usage"]
    assert want["usage"]["completion_tokens"] == 8


def test_completion_matches_vllm(client: openai.OpenAI, vllm_urls: list[str]) -> None:
    got = client.completions.create(model="tiny", prompt=PROMPT, **GREEDY)
    want = direct(vllm_urls[1], "/v1/completions", {"prompt": PROMPT, **GREEDY})
    assert got.choices[0].text == want["choices"][0]["text"]
    assert got.usage is not None
    assert got.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    assert got.usage.completion_tokens == want["usage"]["completion_tokens"] == 8
    assert got.usage.total_tokens == want["usage"]["total_tokens"]


@pytest.mark.parametrize("include_usage", [True, False])
def test_chat_stream(client: openai.OpenAI, vllm_urls: list[str], include_usage: bool) -> None:
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": include_usage},
            **GREEDY,
        )
    )
    want = direct(vllm_urls[0], "/v1/chat/completions", {"messages": MESSAGES, **GREEDY})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want["choices"][0]["message"]["content"]
    assert chunks[0].choices[0].delta.role == "assistant"
    with_usage = [c for c in chunks if c.usage is not None]
    if not include_usage:
        assert with_usage == []
        return
    # The usage chunk comes last, alone, with no choices (OpenAI's layout, kept by vLLM).
    assert with_usage == [chunks[-1]]
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        want["usage"]["prompt_tokens"],
        8,
        want["usage"]["total_tokens"],
    )


@pytest.mark.parametrize("include_usage", [True, False])
def test_completion_stream(
    client: openai.OpenAI, vllm_urls: list[str], include_usage: bool
) -> None:
    stream = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        stream=True,
        stream_options={"include_usage": include_usage},
        **GREEDY,
    )
    chunks = list(stream)
    want = direct(vllm_urls[1], "/v1/completions", {"prompt": PROMPT, **GREEDY})
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want["choices"][0]["text"]
    usages = [c.usage for c in chunks if c.usage is not None]
    if not include_usage:
        assert usages == []
        return
    assert len(usages) == 1
    assert chunks[-1].choices == []
    assert usages[0].prompt_tokens == want["usage"]["prompt_tokens"]
    assert usages[0].completion_tokens == 8


def gateway_tokens(gateway_url: str) -> dict[str, float]:
    """The gateway's own token counters by kind, summed over backends."""
    totals = {"prompt": 0.0, "cached": 0.0, "completion": 0.0}
    for line in httpx.get(gateway_url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("gateway_tokens_total{"):
            kind = line.split('kind="')[1].split('"')[0]
            totals[kind] += float(line.rsplit(" ", 1)[1])
    return totals


@pytest.mark.parametrize("include_usage", [True, False])
def test_gateway_counts_the_tokens_vllm_reported(
    client: openai.OpenAI, gateway_url: str, vllm_urls: list[str], include_usage: bool
) -> None:
    # Without include_usage the gateway asks vLLM for usage anyway and strips it: the
    # counts must still be vLLM's, not an estimate from the chunks (a chunk can carry
    # several tokens).
    before = gateway_tokens(gateway_url)
    stream = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": include_usage},
        **GREEDY,
    )
    for _ in stream:
        pass
    want = direct(vllm_urls[0], "/v1/chat/completions", {"messages": MESSAGES, **GREEDY})
    after = gateway_tokens(gateway_url)
    assert after["prompt"] - before["prompt"] == want["usage"]["prompt_tokens"]
    assert after["completion"] - before["completion"] == 8


def test_multi_turn_conversation_hits_the_prefix_cache(client: openai.OpenAI) -> None:
    # A fresh system prompt of ~700 tokens, so the first turn cannot hit an old entry.
    system = f"Session {uuid.uuid4()}. " + " ".join(
        f"Rule {i}: answer briefly and cite the line." for i in range(60)
    )
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": system}]
    cached = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Question {turn}: what next?"})
        r = client.chat.completions.create(model="tiny", messages=messages, **GREEDY)
        assert r.usage is not None
        assert r.usage.prompt_tokens_details is not None
        cached.append(r.usage.prompt_tokens_details.cached_tokens or 0)
        messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
    assert cached[0] == 0
    # The earlier turns are a prefix of each later one: all but the last partial block hits.
    assert all(c >= 700 for c in cached[1:]), cached


def test_client_disconnect_stops_generation(client: openai.OpenAI, vllm_urls: list[str]) -> None:
    # 4,000 tokens take vLLM 2-5 s here, so a client that leaves after the first event
    # leaves while vLLM still generates, and vLLM must stop short of 4,000 tokens. vLLM's
    # CPU build now and then holds a stream's headers until the whole answer is done (seen
    # with direct clients too); such an attempt cannot leave mid-stream and is repeated.
    # vLLM's num_requests_running gauge lags by seconds, so it is no test of "still
    # running"; the generated-token counter is.
    for _ in range(5):
        before = tokens(vllm_urls)
        leave_mid_stream(client)
        generated = settled_tokens(vllm_urls) - before
        if generated < 4000:
            break
    else:
        pytest.fail("every attempt got its first event only after vLLM had generated it all")
    assert generated > 0
    deadline = time.monotonic() + 10
    while any(metric(u, "vllm:num_requests_running") for u in vllm_urls):
        assert time.monotonic() < deadline, "vLLM still running a request after the client left"
        time.sleep(0.1)


def tokens(vllm_urls: list[str]) -> float:
    return sum(metric(u, "vllm:generation_tokens_total") for u in vllm_urls)


def settled_tokens(vllm_urls: list[str]) -> float:
    """vLLM's generated-token count once it has stopped growing for 0.5 s (10 s at most)."""
    deadline = time.monotonic() + 10
    last = tokens(vllm_urls)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = tokens(vllm_urls)
        if now == last:
            return now
        last = now
    raise AssertionError("vLLM's generated tokens kept growing for 10 s after the client left")


def leave_mid_stream(client: openai.OpenAI) -> None:
    """Read the first event of a long stream and hang up."""
    with client.completions.create(
        model="tiny",
        prompt="x",
        max_tokens=4000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    ) as stream:
        next(iter(stream))


def test_unknown_model_is_a_404_in_openai_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    body = info.value.body
    assert isinstance(body, dict)
    # openai's client unwraps {"error": {...}}; vLLM's own 404 has these same four keys.
    assert set(body) == {"message", "type", "param", "code"}
    assert body["param"] == "model"
    assert "no-such-model" in body["message"]
