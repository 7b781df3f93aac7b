"""Calls sharing a long cold prefix wait for one leader, then follow it to its backend."""

from __future__ import annotations

import asyncio
import os

import openai

from tests.e2e.batching.conftest import batched
from tests.e2e.conftest import MODEL


async def one(client: openai.AsyncOpenAI, document: str, question: int) -> tuple[str, int]:
    """A streamed call on the document; the backend that answered and its cached tokens."""
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": document},
            {"role": "user", "content": f"question {question}: what does it say?"},
        ],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    cached = 0
    async for chunk in raw.parse():
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    return raw.headers["x-backend-instance"], cached


async def test_held_calls_follow_the_leader_and_hit_its_cache(
    client: openai.AsyncOpenAI, gateway: str
) -> None:
    salt = os.urandom(6).hex()
    document = " ".join(f"{salt}-section-{i} states fact {i * 7}." for i in range(300))
    held = batched(gateway, "held")
    results = await asyncio.gather(*(one(client, document, q) for q in range(6)))
    assert len({backend for backend, _ in results}) == 1, results
    cached = sorted(c for _, c in results)
    assert cached[0] == 0, "the leader found a cold cache"
    assert all(c > 1000 for c in cached[1:]), cached
    assert batched(gateway, "held") - held == 5
