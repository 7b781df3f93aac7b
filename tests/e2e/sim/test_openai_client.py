"""The official openai client against `gateway sim` run as a process, as users run it."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.servers import gateway_process

MODEL = "tiny-sim"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with gateway_process("sim", "--model", MODEL, "--step-ms", "2") as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].owned_by == "vllm"


def test_chat_answers_with_usage_and_the_instance_header(
    client: openai.OpenAI, base_url: str
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=5
    )
    port = base_url.rsplit(":", 1)[1]
    assert raw.headers["x-backend-instance"] == f"sim-{port}"
    reply = raw.parse()
    assert reply.id.startswith("chatcmpl-")
    assert reply.object == "chat.completion"
    assert reply.model == MODEL
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5
    assert reply.usage.prompt_tokens_details is not None
    assert isinstance(reply.usage.prompt_tokens_details.cached_tokens, int)


def test_streamed_chat_matches_the_plain_answer_and_ends_with_usage(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert set(finishes[:-1]) == {None}
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_sends_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, stream=True)
    )
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_max_completion_tokens_and_the_default_length(client: openai.OpenAI) -> None:
    capped = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=2)
    assert capped.usage is not None
    assert capped.usage.completion_tokens == 2
    free = client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert free.choices[0].finish_reason == "stop"
    assert free.usage is not None
    assert free.usage.completion_tokens == 16


def test_completions_plain_and_streamed(client: openai.OpenAI) -> None:
    plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
    assert plain.id.startswith("cmpl-")
    assert plain.object == "text_completion"
    assert plain.choices[0].finish_reason == "length"
    assert plain.usage is not None
    assert plain.usage.completion_tokens == 4
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens


def test_embeddings_single_and_list_are_deterministic_unit_vectors(client: openai.OpenAI) -> None:
    one = client.embeddings.create(model=MODEL, input="hello world")  # the client asks for base64
    many = client.embeddings.create(
        model=MODEL, input=["hello world", "goodbye"], encoding_format="float"
    )
    assert len(one.data) == 1
    assert [d.index for d in many.data] == [0, 1]
    v = one.data[0].embedding
    assert len(v) == 256
    assert math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-4)
    assert v == pytest.approx(many.data[0].embedding, abs=1e-6)
    assert many.data[0].embedding != many.data[1].embedding
    assert one.usage.prompt_tokens == 2  # "hello", " world"
    assert many.usage.prompt_tokens == 3  # and "goodbye"


def test_embeddings_base64_is_little_endian_float32(client: openai.OpenAI) -> None:
    raw = client.embeddings.with_raw_response.create(
        model=MODEL, input="hello world", encoding_format="base64"
    )
    b64 = raw.http_response.json()["data"][0]["embedding"]
    floats = struct.unpack("<256f", base64.b64decode(b64))
    assert math.isclose(sum(x * x for x in floats), 1.0, rel_tol=1e-4)
