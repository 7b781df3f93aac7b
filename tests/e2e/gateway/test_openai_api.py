"""The official openai client against the gateway: it must not tell it from vLLM."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL

LONG = " ".join(f"word{i}" for i in range(300))


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_chat_non_streamed(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    resp = raw.parse()
    assert resp.object == "chat.completion"
    assert resp.model == MODEL
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 5
    assert resp.usage.prompt_tokens > 0
    assert raw.headers["x-backend-instance"].startswith("sim-")
    assert raw.headers["x-request-id"]


def test_request_id_is_echoed(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=1,
        extra_headers={"x-request-id": "req-abc-123"},
    )
    assert raw.headers["x-request-id"] == "req-abc-123"


def test_chat_stream_without_usage_hides_the_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
    )
    assert all(c.choices for c in chunks), "a chunk without choices reached the client"
    assert all(c.usage is None for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_stream_with_usage_reports_cached_tokens(client: openai.OpenAI) -> None:
    def ask() -> openai.types.CompletionUsage:
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": LONG}],
                max_tokens=3,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        last = chunks[-1]
        assert last.choices == []
        assert last.usage is not None
        assert sum(1 for c in chunks if c.usage is not None) == 1
        return last.usage

    first, second = ask(), ask()
    assert first.completion_tokens == 3
    assert first.prompt_tokens_details is not None
    assert second.prompt_tokens_details is not None
    first_cached = first.prompt_tokens_details.cached_tokens
    second_cached = second.prompt_tokens_details.cached_tokens
    assert first_cached is not None
    assert second_cached is not None
    assert second_cached > first_cached
    assert second_cached >= second.prompt_tokens // 2


def test_completions_streamed_and_not(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
    assert resp.object == "text_completion"
    assert resp.choices[0].text
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 4
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


def test_embeddings_single_and_list(client: openai.OpenAI) -> None:
    one = client.embeddings.create(model=MODEL, input="hello")
    assert len(one.data) == 1
    assert len(one.data[0].embedding) > 8
    many = client.embeddings.create(model=MODEL, input=["hello", "world", "hello"])
    assert [d.index for d in many.data] == [0, 1, 2]
    assert many.data[0].embedding == many.data[2].embedding == one.data[0].embedding
    assert many.usage.prompt_tokens > one.usage.prompt_tokens


def test_models_lists_the_configured_models(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model"


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"


def test_missing_messages_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[])
    assert info.value.param == "messages"


def test_backend_4xx_passes_through_unchanged(client: openai.OpenAI, sims: list[str]) -> None:
    too_long = "x " * 20_000
    body = {"model": MODEL, "prompt": too_long, "max_tokens": 4}
    direct = httpx.post(sims[0] + "/v1/completions", json=body, timeout=30)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=too_long, max_tokens=4)
    assert direct.status_code == 400
    assert info.value.response.content == direct.content


@pytest.mark.parametrize(
    ("body", "status"),
    [(b"{not json", 400), (b"[]", 400), (b'{"model": "sim-model"}', 400)],
)
def test_malformed_bodies(gateway_url: str, body: bytes, status: int) -> None:
    resp = httpx.post(gateway_url + "/v1/chat/completions", content=body)
    assert resp.status_code == status
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert resp.headers["x-request-id"]


def test_body_too_large_is_413(gateway_url: str) -> None:
    big = b'{"model": "sim-model", "prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    resp = httpx.post(gateway_url + "/v1/completions", content=big)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"


def test_unknown_path_is_openai_shaped_404(gateway_url: str) -> None:
    resp = httpx.get(gateway_url + "/v1/nothing-here")
    assert resp.status_code == 404
    assert resp.json()["error"]["type"] == "invalid_request_error"
