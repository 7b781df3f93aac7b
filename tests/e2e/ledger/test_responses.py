"""The Responses API through the gateway, with the official SDK: answered, streamed,
metered to the token, refused where it must be, cut off when the client leaves."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway.ledger.models import to_usd
from tests.e2e.conftest import MODEL
from tests.e2e.ledger.conftest import ledger_gateway
from tests.e2e.ledger.test_metering import LONG, PRICE, expected_cost
from tests.e2e.ledger.wait import rows_when


@pytest.fixture(scope="module")
def gateway(
    sims: list[str], ledger_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("gw")
    price = {k: str(v) for k, v in PRICE.items()}
    with ledger_gateway(sims[0], ledger_db, workdir, price=price) as url:
        yield url


def test_responses_are_answered_streamed_and_metered_to_the_token(
    gateway: str, client: openai.OpenAI, ledger_db: str
) -> None:
    seen: dict[str, tuple[int, int, int]] = {}
    first = client.responses.create(
        model=MODEL, instructions=LONG, input="Summarise.", max_output_tokens=5,
        extra_headers={"x-request-id": "whole"},
    )  # fmt: skip
    assert first.usage is not None
    assert first.output_text
    seen["whole"] = (first.usage.input_tokens, first.usage.input_tokens_details.cached_tokens,
                     first.usage.output_tokens)  # fmt: skip
    events = list(client.responses.create(
        model=MODEL, instructions=LONG, input=[{"role": "user", "content": "Summarise."}],
        max_output_tokens=5, stream=True, extra_headers={"x-request-id": "stream"},
    ))  # fmt: skip
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    done = events[-1].response
    assert done.usage is not None
    assert done.output_text == "".join(
        e.delta for e in events if e.type == "response.output_text.delta"
    )
    seen["stream"] = (done.usage.input_tokens, done.usage.input_tokens_details.cached_tokens,
                      done.usage.output_tokens)  # fmt: skip
    assert seen["stream"][1] > 0, "the repeated instructions hit the cache"
    assert seen["whole"][1] == 0

    rows = {r["client_request_id"]: r for r in rows_when(ledger_db, "SELECT * FROM ledger", n=2)}
    for rid, (prompt, cached, output) in seen.items():
        row = rows[rid]
        assert (row["endpoint"], row["status"], row["estimated"]) == ("responses", 200, False)
        assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (
            prompt, cached, output)  # fmt: skip
        assert to_usd(row["cost_total"]) == expected_cost(prompt, cached, output)
    streamed, whole = rows["stream"], rows["whole"]
    assert whole["ttft_s"] is None  # as for chat: a whole answer has no first token
    # The first token, not response.created (sent before prefill), ends the stream's TTFT.
    assert 0 < streamed["ttft_s"] <= streamed["latency_s"]
    assert rows["stream"]["stream"]
    assert rows["stream"]["decision"] is not None


def test_a_previous_response_id_is_refused_with_the_reason(
    gateway: str, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="Go on.", previous_response_id="resp_1")
    assert err.value.param == "previous_response_id"
    assert "input" in err.value.message


def test_a_client_that_leaves_a_response_stream_is_metered_as_disconnected(
    gateway: str, ledger_db: str
) -> None:
    body = {"model": MODEL, "input": "keep going", "max_output_tokens": 500, "stream": True}
    headers = {"x-request-id": "left"}
    with httpx.stream("POST", gateway + "/v1/responses", json=body, headers=headers) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(12):  # past the opening events, into the deltas
            next(lines)
    (row,) = rows_when(ledger_db, "SELECT * FROM ledger WHERE client_request_id = $1", "left", n=1)
    assert row["disconnected"]
    assert row["estimated"]
    assert 0 < row["completion_tokens"] < 500
