"""The gateway owns every call's id: a client's x-request-id can neither merge two calls
into one ledger row nor, carrying what no column can hold, stop the ledger."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.keys.secret import end_user_key, hash_end_user
from tests.e2e.conftest import MODEL
from tests.e2e.ledger.conftest import ADMIN, ledger_gateway
from tests.e2e.ledger.wait import rows_when
from tests.servers import ROOT

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def gateway(
    sims: list[str], ledger_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with ledger_gateway(sims[0], ledger_db, tmp_path_factory.mktemp("gw")) as url:
        yield url


def test_five_calls_with_one_request_id_leave_five_rows(
    gateway: str, client: openai.OpenAI, ledger_db: str
) -> None:
    ids = []
    for _ in range(5):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, extra_headers={"x-request-id": "same-1"}
        )
        assert raw.headers["x-request-id"] == "same-1"
        ids.append(raw.headers["x-gateway-request-id"])
    assert len(set(ids)) == 5

    rows = rows_when(
        ledger_db, "SELECT request_id, status FROM ledger WHERE client_request_id = $1",
        "same-1", n=5,
    )  # fmt: skip
    assert sorted(r["request_id"] for r in rows) == sorted(ids)
    assert {r["status"] for r in rows} == {200}
    # ... and the client's id finds them all, from the admin API and from the CLI.
    found = httpx.get(
        gateway + "/admin/calls",
        params={"client_request_id": "same-1"},
        headers={"authorization": f"Bearer {ADMIN}"},
    ).json()["data"]
    assert [c["request_id"] for c in found] == ids  # oldest first
    cli = subprocess.run(
        [sys.executable, "-m", "gateway", "ledger", "calls", "--client-request-id", "same-1",
         "--database-url", ledger_db],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=True,
    )  # fmt: skip
    assert json.loads(cli.stdout)["data"] == found


def test_without_a_request_id_both_headers_carry_the_gateways(
    client: openai.OpenAI, ledger_db: str
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=1
    )
    gateway_id = raw.headers["x-gateway-request-id"]
    assert raw.headers["x-request-id"] == gateway_id
    rows = rows_when(
        ledger_db, "SELECT client_request_id FROM ledger WHERE request_id = $1", gateway_id, n=1
    )
    assert [r["client_request_id"] for r in rows] == [None]


def test_a_nul_in_the_model_is_refused_and_its_row_is_stored(
    client: openai.OpenAI, ledger_db: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="sim\x00model", messages=MESSAGES, extra_headers={"x-request-id": "poison-1"}
        )
    assert info.value.status_code == 400
    assert isinstance(info.value.body, dict)
    assert info.value.body["param"] == "model"
    # The ledger still takes rows: the refused call's own, and a good one after it.
    after = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=1, extra_headers={"x-request-id": "after-1"}
    )
    assert after.headers["x-request-id"] == "after-1"
    rows = rows_when(
        ledger_db,
        "SELECT client_request_id, model, status, error_type FROM ledger "
        "WHERE client_request_id IN ('poison-1', 'after-1') ORDER BY id",
        n=2,
    )
    assert [tuple(r) for r in rows] == [
        ("poison-1", None, 400, "invalid_request_error"), ("after-1", MODEL, 200, None)
    ]  # fmt: skip


def test_an_overlong_request_id_is_refused_by_name(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"x-request-id": "r" * 129}
        )
    assert isinstance(info.value.body, dict)
    assert info.value.body["param"] == "x-request-id"
    headers = info.value.response.headers
    assert headers["x-request-id"] == headers["x-gateway-request-id"]


def test_each_calls_end_user_is_on_its_row_hashed(
    gateway: str, client: openai.OpenAI, ledger_db: str
) -> None:
    """OpenAI's safety_identifier (else user) through the official client: the row holds
    its keyed hash and nothing of the name."""
    sent = {"safety_identifier": "ada@example.com", "user": "ada@example.com"}
    calls = [({"safety_identifier": "ada@example.com"}, "ada@example.com"),
             ({"user": "bob"}, "bob"), ({"safety_identifier": "carol", "user": "bob"}, "carol"),
             (sent, "ada@example.com")]  # fmt: skip
    ids = {}
    for fields, end_user in calls:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=2,
            safety_identifier=fields.get("safety_identifier", openai.omit),
            user=fields.get("user", openai.omit),
        )
        ids[raw.headers["x-gateway-request-id"]] = end_user
    rows = rows_when(
        ledger_db, "SELECT * FROM ledger WHERE request_id = ANY($1::text[])", list(ids), n=4
    )
    key = end_user_key("")  # the pepper this gateway runs with
    assert {r["request_id"]: r["end_user"] for r in rows} == {
        call: hash_end_user(name, key) for call, name in ids.items()
    }
    # Whole names only: "ada" alone is made of hex digits, so a hash may hold it by chance.
    cells = [str(value) for row in rows for value in row.values()]
    assert not [name for name in set(ids.values()) for cell in cells if name in cell]
    report = httpx.get(
        gateway + "/admin/reports/costs", params={"group_by": "user"},
        headers={"authorization": f"Bearer {ADMIN}"},
    ).json()  # fmt: skip
    per_user = {line["user"]: line["requests"] for line in report["rows"] if line["user"]}
    names = list(ids.values())
    assert per_user == {hash_end_user(n, key): names.count(n) for n in set(names)}
