"""One streamed chat completion, timed: the only module that speaks HTTP.

aiohttp directly, with SSE lines parsed by hand with orjson: the load generator shares
two cores with what it measures, so a request costs it one JSON decode per chunk and
nothing more (the openai SDK would add validation and object building per chunk).
Timing uses ``time.perf_counter``; TTFT and inter-token gaps count only chunks that
carry content, since servers may send an empty role chunk before the first token.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from gateway.bench.workloads import Turn

INSTANCE_HEADER = "x-backend-instance"
GATEWAY_BACKEND_HEADER = "x-gateway-backend"
"""The backend our gateway chose: counts instances behind it when they name no instance."""
FAILURES = (aiohttp.ClientError, TimeoutError, ValueError, TypeError, AttributeError)
"""Network failures, and chunks that are not JSON (ValueError) or not shaped like a
chat chunk: each fails its own request, counted by class, and never the whole run."""


@dataclass(frozen=True, slots=True)
class Target:
    """An OpenAI-compatible base URL (ending in /v1, as the SDK's base_url) to measure."""

    base_url: str
    label: str = ""
    api_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.label or self.base_url

    def request_headers(self) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {"Content-Type": "application/json", **auth, **self.headers}


@dataclass(slots=True)
class Sample:
    """What one request did, as seen by the client."""

    turn: Turn
    started: float
    """perf_counter() when the request was sent."""
    ttft: float | None = None
    latency: float | None = None
    """Seconds until the stream ended; None when the request failed."""
    gaps: list[float] = field(default_factory=list)
    """Seconds between consecutive content chunks."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    instance: str = "unknown"
    error: str | None = None
    """HTTP status ("HTTP 503"), exception class, or a stream-level failure."""
    answer: str = ""


def open_session(target: Target, connections: int, timeout: float) -> aiohttp.ClientSession:
    """A pooled client for one target, its pool sized to the load it will carry."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout),
        headers=target.request_headers(),
    )


class TargetUnavailable(Exception):
    """The target could not say which model it serves: the run cannot start."""


async def first_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model id at base_url/models: the default when no model is given."""
    try:
        async with session.get(f"{base_url}/models") as resp:
            resp.raise_for_status()
            models = [str(m["id"]) for m in orjson.loads(await resp.read())["data"]]
    except (*FAILURES, KeyError) as exc:
        raise TargetUnavailable(f"cannot list models at {base_url}/models: {exc}") from exc
    if not models:
        raise TargetUnavailable(f"{base_url}/models lists no model")
    return models[0]


async def stream_chat(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    turn: Turn,
    headers: Mapping[str, str] | None = None,
) -> Sample:
    """POST a streamed chat completion and time it; failures become Sample.error."""
    sample = Sample(turn=turn, started=time.perf_counter())
    try:
        async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
            sample.instance = resp.headers.get(
                INSTANCE_HEADER, resp.headers.get(GATEWAY_BACKEND_HEADER, "unknown")
            )
            if resp.status != 200:
                await resp.read()
                sample.error = f"HTTP {resp.status}"
                return sample
            await _consume(resp.content, sample)
    except FAILURES as exc:
        sample.error = type(exc).__name__
    return sample


async def _consume(stream: aiohttp.StreamReader, sample: Sample) -> None:
    parts: list[str] = []
    last: float | None = None
    done = False
    async for line in stream:
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            break
        chunk = orjson.loads(payload)
        if "error" in chunk:
            sample.error = "StreamError"
            return
        if usage := chunk.get("usage"):
            _read_usage(usage, sample)
        for choice in chunk.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                now = time.perf_counter()
                if last is None:
                    sample.ttft = now - sample.started
                else:
                    sample.gaps.append(now - last)
                last = now
                parts.append(content)
    if not done:
        sample.error = "IncompleteStream"
        return
    sample.latency = time.perf_counter() - sample.started
    sample.answer = "".join(parts)
    if not sample.completion_tokens:
        sample.completion_tokens = len(parts)


def _read_usage(usage: Mapping[str, Any], sample: Sample) -> None:
    sample.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    sample.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    sample.cached_tokens = int(details.get("cached_tokens") or 0)
