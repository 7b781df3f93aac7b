"""Hostile input over real sockets: a corpus and a property-based fuzz of the request bodies.

Judged on every answer: a status below 500 and OpenAI-shaped JSON (an error object with
message, type, param and code, or a completion); and on the whole run: every request the
gateway received is one access-log line and one count in gateway_requests_total.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import MODEL
from tests.faults.cluster import Cluster, Stores, start_cluster
from tests.faults.corpus import CORPUS, MAX_BODY, REFUSED_BY_HTTP, Hostile, encode, nested
from tests.faults.rawhttp import Answer, request

FUZZ_EXAMPLES = int(os.environ.get("GATEWAY_FUZZ_EXAMPLES", "100"))
"""Examples per endpoint; CI runs the default, a longer hunt sets more."""


@pytest.fixture(scope="module")
def target(stores: Stores, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A gateway with keys on before instant simulators (the backend's time is not judged)."""
    workdir = tmp_path_factory.mktemp("hostile")
    with start_cluster(stores, workdir, "--instant", server={"max_body_bytes": MAX_BODY}) as c:
        yield c


def port(cluster: Cluster) -> int:
    return int(cluster.url.rsplit(":", 1)[1])


def problems(status: int, content_type: str, body: bytes) -> list[str]:
    """What is wrong with one answer: nothing, for a non-5xx OpenAI-shaped one."""
    found = [f"status {status}"] if status >= 500 else []
    if status == 200 and content_type.startswith("text/event-stream"):
        return found if body.rstrip().endswith(b"data: [DONE]") else [*found, "stream unfinished"]
    if not content_type.startswith("application/json"):
        return [*found, f"content type {content_type!r}"]
    try:
        data = json.loads(body)
    except ValueError:
        return [*found, "body is not JSON"]
    if not isinstance(data, dict):
        return [*found, "body is not a JSON object"]
    if status >= 400:
        error = data.get("error")
        shaped = (
            isinstance(error, dict)
            and isinstance(error.get("message"), str)
            and isinstance(error.get("type"), str)
            and {"param", "code"} <= error.keys()
        )
        if not shaped:
            found.append(f"error not OpenAI-shaped: {body[:200]!r}")
    elif not ("choices" in data or "data" in data):
        found.append(f"neither an error nor an answer: {body[:200]!r}")
    if b"Traceback" in body:
        found.append("traceback in the body")
    return found


def judge(entry: Hostile, answer: Answer) -> list[str]:
    found = problems(answer.status, answer.headers.get("content-type", ""), answer.body)
    if entry.status is not None and answer.status != entry.status:
        found.append(f"status {answer.status}, expected {entry.status}: {answer.body[:200]!r}")
    elif entry.status == 400:
        param = json.loads(answer.body)["error"]["param"]
        if param != entry.param:
            found.append(f"param {param!r}, expected {entry.param!r}")
    return [f"{entry.name}: {p}" for p in found]


def request_ids(lines: list[dict[str, Any]]) -> set[str]:
    """Every string an access line carries: whichever field holds the call's id."""
    return {v for line in lines for v in line.values() if isinstance(v, str)}


class Accounting:
    """What the gateway recorded between two moments: access lines and requests counted."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.lines = len(cluster.access_lines())
        self.counted = cluster.metric("gateway_requests_total")

    def since(self, expected: int, within: float = 5.0) -> tuple[list[dict[str, Any]], float]:
        """What was recorded once ``expected`` access lines came, or after ``within``
        seconds: a call's line is written after its answer is sent, and reaches the test
        through a pipe."""
        deadline = time.monotonic() + within
        while len(lines := self.cluster.access_lines()[self.lines :]) < expected:
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return lines, self.cluster.metric("gateway_requests_total") - self.counted


def test_hostile_corpus_gets_openai_shaped_answers_below_500(target: Cluster) -> None:
    assert len(CORPUS) >= 100
    key = ((b"authorization", b"Bearer " + target.key.encode()),)
    before = Accounting(target)
    found: list[str] = []
    ids = []
    for entry in CORPUS:
        headers = (*entry.headers, *key) if entry.authorized else entry.headers
        answer = request(
            port(target), entry.path, entry.body, headers, content_length=entry.content_length
        )
        found += judge(entry, answer)
        ids.append(answer.headers.get("x-request-id"))
    assert not found, "\n".join(found)
    lines, counted = before.since(len(CORPUS))
    assert (len(lines), counted) == (len(CORPUS), len(CORPUS))
    assert None not in ids
    assert set(ids) - {""} <= request_ids(lines)


def test_header_values_http_forbids_are_refused_before_the_gateway(target: Cluster) -> None:
    before = Accounting(target)
    for name, headers in REFUSED_BY_HTTP:
        answer = request(port(target), "/v1/chat/completions", b"{}", headers)
        assert answer.status == 400, name
    assert before.since(1, within=0.5) == ([], 0)  # a line would have come by then


ENDPOINTS = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            {"role": "user", "content": "thanks"},
        ],
        "max_tokens": 4,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    },
    "/v1/completions": {"model": MODEL, "prompt": ["once upon"], "max_tokens": 4, "n": 1},
    "/v1/embeddings": {"model": MODEL, "input": ["a", "b"], "encoding_format": "float"},
}  # fmt: skip


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a body a value can be put: each key and index, and one new key each."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        out.append((*prefix, "x_new"))
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def put(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of body with value at path."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy = list(body) if isinstance(body, list) else dict(body)
    copy[head] = put(body[head] if rest else None, rest, value)
    return copy


TEXT = st.text(st.characters(codec=None), max_size=12) | st.sampled_from(
    ["", "\x00", "sim-model\x00", "\u202e", "\ufeff", "\U0010ffff", "\ud800", "e\u0301", "🙂"]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
) | st.integers(95, 400).map(nested)


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """A valid body of some endpoint with one to three places replaced by hostile values."""
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    body: Any = ENDPOINTS[path]
    for _ in range(draw(st.integers(1, 3))):
        body = put(body, draw(st.sampled_from(paths(body))), draw(JSON_VALUES))
    if draw(st.booleans()):
        body = put(body, ("stream",), draw(st.sampled_from([True, False, None, "yes"])))
    return path, encode(body)


def test_fuzzed_bodies_get_openai_shaped_answers_below_500(target: Cluster) -> None:
    sent: list[str] = []
    before = Accounting(target)
    headers = {"authorization": f"Bearer {target.key}", "content-type": "application/json"}
    with httpx.Client(base_url=target.url, headers=headers, timeout=30) as client:

        @settings(
            max_examples=FUZZ_EXAMPLES * len(ENDPOINTS),
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(hostile_bodies())
        def answers_well(case: tuple[str, bytes]) -> None:
            path, body = case
            response = client.post(path, content=body)
            response.read()
            sent.append(response.headers.get("x-request-id", ""))
            found = problems(
                response.status_code, response.headers.get("content-type", ""), response.content
            )
            assert found == [], (path, body[:500])

        answers_well()
    lines, counted = before.since(len(sent))
    assert (len(lines), counted) == (len(sent), len(sent))
    assert set(sent) - {""} <= request_ids(lines)
