"""Every call through the gateway becomes one exactly priced ledger row in Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import asyncpg
import httpx
import openai
import pytest

from gateway.ledger.models import to_usd
from tests.e2e.conftest import MODEL
from tests.e2e.ledger.conftest import ADMIN, ledger_gateway
from tests.e2e.ledger.wait import rows_when

PRICE = {"input": Decimal("3.00"), "cached_input": Decimal("0.30"), "output": Decimal("15.00")}
MILLION = Decimal(1_000_000)
LONG = " ".join(f"term{i}" for i in range(400))


def expected_cost(prompt: int, cached: int, completion: int) -> Decimal:
    return (
        (prompt - cached) * PRICE["input"] + cached * PRICE["cached_input"]
        + completion * PRICE["output"]
    ) / MILLION  # fmt: skip


def ledger_rows(pg_url: str, n: int) -> dict[str, asyncpg.Record]:
    """The ledger's rows once n have arrived, by the x-request-id each call was sent with."""
    return {r["client_request_id"]: r for r in rows_when(pg_url, "SELECT * FROM ledger", n=n)}


@pytest.fixture(scope="module")
def gateway(
    sims: list[str], pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    price = {k: str(v) for k, v in PRICE.items()}
    with ledger_gateway(sims[0], pg_url, tmp_path_factory.mktemp("gw"), price=price) as url:
        yield url


def test_a_known_mix_of_calls_gives_exact_rows_and_report(
    gateway: str, client: openai.OpenAI, pg_url: str
) -> None:
    seen: dict[str, tuple[int, int, int]] = {}

    def chat(rid: str, stream: bool) -> None:
        resp = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": LONG}], max_tokens=6,
            stream=stream, extra_headers={"x-request-id": rid},
            stream_options={"include_usage": True} if stream else openai.omit,
        )  # fmt: skip
        usage = list(resp)[-1].usage if isinstance(resp, openai.Stream) else resp.usage
        assert usage is not None
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        seen[rid] = (usage.prompt_tokens, cached or 0, usage.completion_tokens)

    chat("uncached", stream=False)
    chat("cached-stream", stream=True)
    completion = client.completions.create(
        model=MODEL, prompt="short prompt", max_tokens=3, extra_headers={"x-request-id": "cmpl"}
    )
    assert completion.usage is not None
    seen["cmpl"] = (completion.usage.prompt_tokens, 0, completion.usage.completion_tokens)
    # A stream the client did not ask usage for: the gateway still meters the backend's.
    hidden = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4,
        stream=True, extra_headers={"x-request-id": "no-usage-asked"},
    ))  # fmt: skip
    assert all(c.usage is None for c in hidden)
    # A client that leaves mid-stream: metered by the gateway's own count, marked estimated.
    body = {"model": MODEL, "prompt": "keep going", "max_tokens": 500, "stream": True}
    headers = {"x-request-id": "disconnect"}
    with httpx.stream("POST", gateway + "/v1/completions", json=body, headers=headers) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-request-id": "error-404"},
        )  # fmt: skip

    rows = ledger_rows(pg_url, 6)
    assert set(rows) == {*seen, "no-usage-asked", "disconnect", "error-404"}
    assert seen["cached-stream"][1] > 0, "the repeat of the long prompt hit the cache"
    for rid, (prompt, cached, completion_tokens) in seen.items():
        row = rows[rid]
        assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (
            prompt, cached, completion_tokens)  # fmt: skip
        assert row["input_tokens"] == prompt - cached
        assert to_usd(row["cost_total"]) == expected_cost(prompt, cached, completion_tokens)
        assert to_usd(row["cost_without_cache"]) == expected_cost(prompt, 0, completion_tokens)
        assert not row["estimated"]
    assert rows["cached-stream"]["stream"]
    assert rows["no-usage-asked"]["completion_tokens"] == 4
    assert not rows["no-usage-asked"]["estimated"]
    gone = rows["disconnect"]
    assert gone["disconnected"]
    assert gone["estimated"]
    assert 0 < gone["completion_tokens"] < 500
    assert rows["error-404"]["status"] == 404
    assert rows["error-404"]["cost_total"] == 0

    report = httpx.get(
        gateway + "/admin/reports/costs",
        params={"group_by": "model"},
        headers={"authorization": f"Bearer {ADMIN}"},
    ).json()
    totals = report["totals"]
    # The 404 was refused, served nothing.
    assert (totals["requests"], totals["refused"], totals["failed"]) == (5, 1, 0)
    assert Decimal(totals["cost_total"]) == to_usd(sum(r["cost_total"] for r in rows.values()))
    assert Decimal(totals["cost_total"]) == sum(
        Decimal(line["cost_total"]) for line in report["rows"]
    )
    saved = Decimal(totals["savings"])
    cached = seen["cached-stream"][1]
    assert saved == cached * (PRICE["input"] - PRICE["cached_input"]) / MILLION
