"""Concurrent embeddings calls within the window go upstream as one list request."""

from __future__ import annotations

import asyncio
import os

import openai

from tests.e2e.batching.conftest import Upstreams, batched
from tests.e2e.conftest import MODEL

EMBED = "/v1/embeddings"


async def test_calls_in_one_window_share_one_upstream_call(
    client: openai.AsyncOpenAI, upstreams: Upstreams, gateway: str
) -> None:
    salt = os.urandom(4).hex()
    inputs: list[str | list[str]] = [
        f"{salt} first text",
        [f"{salt} second text is longer than the first", f"{salt} third"],
        f"{salt} fourth one",
        [f"{salt} fifth", f"{salt} sixth", f"{salt} seventh and last"],
    ]
    before, riders = upstreams.posts(EMBED), batched(gateway, "batched")
    got = await asyncio.gather(
        *(client.embeddings.create(model=MODEL, input=i, encoding_format="float") for i in inputs)
    )
    assert upstreams.posts(EMBED) - before == 1
    assert batched(gateway, "batched") - riders == len(inputs) - 1
    async with openai.AsyncOpenAI(
        base_url=upstreams.sims[0] + "/v1", api_key="unused", max_retries=0
    ) as direct:
        want = [
            await direct.embeddings.create(model=MODEL, input=i, encoding_format="float")
            for i in inputs
        ]
    for g, w in zip(got, want, strict=True):
        assert [d.index for d in g.data] == list(range(len(w.data)))
        assert [d.embedding for d in g.data] == [d.embedding for d in w.data]
    assert sum(g.usage.prompt_tokens for g in got) == sum(w.usage.prompt_tokens for w in want)
    assert all(g.usage.total_tokens == g.usage.prompt_tokens for g in got)


async def test_the_default_base64_format_batches_too(
    client: openai.AsyncOpenAI, upstreams: Upstreams
) -> None:
    salt = os.urandom(4).hex()
    before = upstreams.posts(EMBED)
    got = await asyncio.gather(
        *(client.embeddings.create(model=MODEL, input=f"{salt} text {i}") for i in range(3))
    )
    assert upstreams.posts(EMBED) - before == 1
    assert all(len(g.data) == 1 and len(g.data[0].embedding) == 256 for g in got)
    assert len({tuple(g.data[0].embedding) for g in got}) == 3


async def test_one_bad_input_does_not_fail_the_others(
    client: openai.AsyncOpenAI, upstreams: Upstreams
) -> None:
    salt = os.urandom(4).hex()
    results = await asyncio.gather(
        client.embeddings.create(model=MODEL, input=f"{salt} fine"),
        client.embeddings.create(model=MODEL, input="word " * 9000),
        client.embeddings.create(model=MODEL, input=[f"{salt} also", f"{salt} fine"]),
        return_exceptions=True,
    )
    assert isinstance(results[1], openai.BadRequestError)
    assert "maximum context length" in results[1].message
    fine = [r for i, r in enumerate(results) if i != 1]
    assert all(isinstance(r, openai.types.CreateEmbeddingResponse) for r in fine), fine
    assert [len(r.data) for r in fine] == [1, 2]  # type: ignore[union-attr]
