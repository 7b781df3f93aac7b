"""A known mix of calls through the gateway, and a reader for what /metrics says of it."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import openai
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessageParam
from openai.types.create_embedding_response import Usage as EmbeddingUsage
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL

Labels = frozenset[tuple[str, str]]


@dataclass
class Expected:
    """What the mix must have added to the gateway's counters."""

    requests: Tally[tuple[str, str]] = field(default_factory=Tally)
    """(endpoint, status) -> calls."""
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    streamed: int = 0
    dispatched: int = 0
    overheads: list[float] = field(default_factory=list)
    """x-gateway-overhead-ms of every successful call, as the client saw it."""

    def add(self, endpoint: str, usage: CompletionUsage | EmbeddingUsage | None) -> None:
        self.requests[endpoint, "200"] += 1
        self.dispatched += 1
        assert usage is not None
        self.prompt += usage.prompt_tokens
        details = getattr(usage, "prompt_tokens_details", None)
        self.cached += (details.cached_tokens or 0) if details else 0
        self.completion += getattr(usage, "completion_tokens", 0) or 0


@contextmanager
def fresh_connections(base_url: str) -> Iterator[openai.OpenAI]:
    """An openai client that opens a new connection per call, so that with several
    worker processes the calls spread over them."""
    limits = httpx.Limits(max_keepalive_connections=0)
    with (
        httpx.Client(limits=limits, timeout=30) as http,
        openai.OpenAI(
            base_url=base_url + "/v1",
            api_key="unused",
            max_retries=0,
            # openai takes an httpx client at run time; its annotation names only httpx2's.
            http_client=http,  # type: ignore[arg-type]
        ) as client,
    ):
        yield client


def run_mix(base_url: str, rounds: int = 2) -> Expected:
    """Chat and completions, streamed and not, embeddings, and two client errors."""
    exp = Expected()
    prompt = " ".join(f"token{i}" for i in range(120))
    with fresh_connections(base_url) as client:
        for i in range(rounds):
            messages: list[ChatCompletionMessageParam] = [
                {"role": "user", "content": f"{prompt} question {i}"}
            ]
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=4
            )
            exp.overheads.append(float(raw.headers["x-gateway-overhead-ms"]))
            exp.add("chat", raw.parse().usage)
            stream = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
            exp.overheads.append(float(stream.headers["x-gateway-overhead-ms"]))
            chunks = list(stream.parse())
            exp.add("chat", chunks[-1].usage)
            exp.streamed += 1
            text = client.completions.create(model=MODEL, prompt=f"Once {i}", max_tokens=3)
            exp.add("completions", text.usage)
            streamed = list(
                client.completions.create(
                    model=MODEL,
                    prompt=f"Twice {i}",
                    max_tokens=2,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            exp.add("completions", streamed[-1].usage)
            exp.streamed += 1
            emb = client.embeddings.create(model=MODEL, input=[f"a {i}", f"b {i}"])
            exp.add("embeddings", emb.usage)
        try:
            client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "x"}]
            )
        except openai.NotFoundError:
            exp.requests["chat", "404"] += 1
        try:
            client.chat.completions.create(model=MODEL, messages=[])
        except openai.BadRequestError:
            exp.requests["chat", "400"] += 1
    return exp


class Scrape:
    """One scrape of /metrics: sums of samples by name and label subset."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: list[tuple[str, dict[str, str], float]] = [
            (s.name, s.labels, s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def total(self, name: str, **labels: str) -> float:
        return sum(
            v
            for n, lab, v in self.samples
            if n == name and all(lab.get(k) == want for k, want in labels.items())
        )

    def values(self, name: str) -> dict[Labels, float]:
        return {frozenset(lab.items()): v for n, lab, v in self.samples if n == name}


def scrape(base_url: str) -> Scrape:
    """Scrape over a new connection (with several workers, any of them may answer)."""
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10) as http:
        resp = http.get(base_url + "/metrics")
    resp.raise_for_status()
    return Scrape(resp.text)
