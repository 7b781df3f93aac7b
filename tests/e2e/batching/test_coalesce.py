"""Identical deterministic calls in flight together share one upstream call."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from tests.e2e.batching.conftest import Upstreams, all_of, batched
from tests.e2e.conftest import MODEL

CHAT = "/v1/chat/completions"


def messages(tag: str) -> list[ChatCompletionMessageParam]:
    """A prompt no other test sends: the calls under test are alone in flight."""
    return [{"role": "user", "content": f"{tag} {os.urandom(6).hex()} tell me a story"}]


async def test_identical_calls_share_one_upstream_call(
    client: openai.AsyncOpenAI, upstreams: Upstreams, gateway: str
) -> None:
    before, coalesced = upstreams.posts(CHAT), batched(gateway, "coalesced")
    prompt = messages("same")
    raws = await asyncio.gather(
        *(
            client.chat.completions.with_raw_response.create(
                model=MODEL, messages=prompt, temperature=0, max_tokens=12
            )
            for _ in range(6)
        )
    )
    answers = [r.parse() for r in raws]
    assert upstreams.posts(CHAT) - before == 1
    assert len({a.choices[0].message.content for a in answers}) == 1
    assert all(a.usage == answers[0].usage for a in answers)
    assert len({r.headers["x-request-id"] for r in raws}) == 6
    assert batched(gateway, "coalesced") - coalesced == 5


async def test_sampled_calls_are_not_coalesced(
    client: openai.AsyncOpenAI, upstreams: Upstreams
) -> None:
    before = upstreams.posts(CHAT)
    prompt = messages("sampled")
    await asyncio.gather(
        *(
            client.chat.completions.create(
                model=MODEL, messages=prompt, temperature=0.7, max_tokens=4
            )
            for _ in range(3)
        )
    )
    assert upstreams.posts(CHAT) - before == 3


async def read_stream(
    stream: openai.AsyncStream[ChatCompletionChunk], first: asyncio.Event | None = None
) -> list[ChatCompletionChunk]:
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        if first is not None and chunk.choices and chunk.choices[0].delta.content:
            first.set()
    return chunks


def streamed(tag: str, max_tokens: int) -> dict[str, Any]:
    """Arguments of a deterministic streamed chat call with a fresh prompt."""
    return {
        "model": MODEL,
        "messages": messages(tag),
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
    }


def text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_a_late_joiner_gets_the_stream_from_its_start(
    client: openai.AsyncOpenAI, upstreams: Upstreams
) -> None:
    before = upstreams.posts(CHAT)
    args = streamed("stream", 40)
    first = asyncio.Event()
    leader = asyncio.create_task(read_stream(await client.chat.completions.create(**args), first))
    await first.wait()  # the leader's answer is under way
    joiner = await read_stream(
        await client.chat.completions.create(**args, stream_options={"include_usage": True})
    )
    led = await leader
    assert upstreams.posts(CHAT) - before == 1
    assert text(joiner) == text(led)
    assert len(text(led).split()) >= 20
    assert joiner[0].choices[0].delta.role == "assistant"
    # Each keeps its own usage preference: only the joiner asked for the usage chunk.
    assert all(c.usage is None for c in led)
    assert joiner[-1].usage is not None
    assert joiner[-1].usage.completion_tokens == 40


async def test_a_listener_leaving_does_not_stop_the_others(
    client: openai.AsyncOpenAI, upstreams: Upstreams
) -> None:
    before = upstreams.posts(CHAT)
    args = streamed("leave", 30)
    leader = await client.chat.completions.create(**args)
    follower = asyncio.create_task(read_stream(await client.chat.completions.create(**args)))
    async for chunk in leader:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    await leader.close()  # the leader's client goes away mid-answer
    chunks = await follower
    assert upstreams.posts(CHAT) - before == 1
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len(text(chunks).split()) >= 15


async def test_an_upstream_error_reaches_every_caller(
    client: openai.AsyncOpenAI, upstreams: Upstreams
) -> None:
    before = upstreams.posts(CHAT)
    prompt = messages("too long")
    results = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=MODEL, messages=prompt, temperature=0, max_tokens=100_000
            )
            for _ in range(4)
        ),
        return_exceptions=True,
    )
    assert len({r.message for r in all_of(openai.BadRequestError, results)}) == 1
    assert 1 <= upstreams.posts(CHAT) - before <= 4
