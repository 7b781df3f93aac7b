"""Concurrent embeddings calls go upstream as one list request while another is in flight.

Each test first sends one call on its own: it finds nothing in flight and goes straight
upstream (the proxy holds it there for EMBEDDINGS_DELAY), so the calls sent next find
the group busy and are collected into one batch.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from typing import Any, TypeVar

import openai

from tests.e2e.batching.conftest import Upstreams, all_of, batched
from tests.e2e.conftest import MODEL

EMBED = "/v1/embeddings"
T = TypeVar("T")


async def behind_one_in_flight(
    client: openai.AsyncOpenAI, upstreams: Upstreams, calls: list[Awaitable[T]], **options: Any
) -> list[T | BaseException]:
    """Run the calls together once a first call, sent alone, is upstream."""
    before = upstreams.posts(EMBED)
    first = asyncio.create_task(
        client.embeddings.create(model=MODEL, input=os.urandom(4).hex(), **options)
    )
    await asyncio.to_thread(upstreams.wait_for_posts, EMBED, before)
    results = await asyncio.gather(*calls, return_exceptions=True)
    await first
    return results


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
    got = await behind_one_in_flight(
        client,
        upstreams,
        [client.embeddings.create(model=MODEL, input=i, encoding_format="float") for i in inputs],
        encoding_format="float",
    )
    assert upstreams.posts(EMBED) - before == 2  # the first call, then one for the batch
    assert batched(gateway, "batched") - riders == len(inputs) - 1
    async with openai.AsyncOpenAI(
        base_url=upstreams.sims[0] + "/v1", api_key="unused", max_retries=0
    ) as direct:
        want = [
            await direct.embeddings.create(model=MODEL, input=i, encoding_format="float")
            for i in inputs
        ]
    answers = all_of(openai.types.CreateEmbeddingResponse, got)
    for g, w in zip(answers, want, strict=True):
        assert [d.index for d in g.data] == list(range(len(w.data)))
        assert [d.embedding for d in g.data] == [d.embedding for d in w.data]
        assert g.usage.total_tokens == g.usage.prompt_tokens
    assert sum(g.usage.prompt_tokens for g in answers) == sum(w.usage.prompt_tokens for w in want)


async def test_the_default_base64_format_batches_too(
    client: openai.AsyncOpenAI, upstreams: Upstreams
) -> None:
    salt = os.urandom(4).hex()
    before = upstreams.posts(EMBED)
    got = await behind_one_in_flight(
        client,
        upstreams,
        [client.embeddings.create(model=MODEL, input=f"{salt} {i}") for i in range(3)],
    )
    assert upstreams.posts(EMBED) - before == 2
    vectors = [g.data[0].embedding for g in all_of(openai.types.CreateEmbeddingResponse, got)]
    assert all(len(v) == 256 for v in vectors)
    assert len({tuple(v) for v in vectors}) == 3


async def test_one_bad_input_does_not_fail_the_others(
    client: openai.AsyncOpenAI, upstreams: Upstreams
) -> None:
    salt = os.urandom(4).hex()
    before = upstreams.posts(EMBED)
    results = await behind_one_in_flight(
        client,
        upstreams,
        [
            client.embeddings.create(model=MODEL, input=f"{salt} fine"),
            client.embeddings.create(model=MODEL, input="word " * 9000),
            client.embeddings.create(model=MODEL, input=[f"{salt} also", f"{salt} fine"]),
        ],
    )
    # The first call, the refused batch, then each of the three on its own.
    assert upstreams.posts(EMBED) - before == 5
    assert isinstance(results[1], openai.BadRequestError)
    assert "maximum context length" in results[1].message
    fine = all_of(openai.types.CreateEmbeddingResponse, [results[0], results[2]])
    assert [len(r.data) for r in fine] == [1, 2]
