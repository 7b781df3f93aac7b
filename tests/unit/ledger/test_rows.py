"""A call's ledger row: every value fits its column, whatever the call carried."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

from gateway.flow import Call, Cost, Principal, Request, Route, Usage
from gateway.keys.secret import end_user_key
from gateway.ledger.models import ROW_COLUMNS
from gateway.ledger.rows import MAX_INT, Row, ledger_row


def test_row_fields_are_the_table_columns_in_order() -> None:
    assert Row._fields == ROW_COLUMNS


def test_odd_values_are_cut_and_clamped_to_their_columns() -> None:
    call = Call(id="r" * 100, path="/v1/chat/completions", received_at=10.0,
                received_wall=1_800_000_000.5)  # fmt: skip
    call.principal = Principal(key_id="k" * 100, team="t" * 300)
    call.request = Request(endpoint="chat", model="m" * 300, body={}, stream=True)
    call.route = Route(backend="b" * 300, decision="hit", predicted_cached_tokens=-4)
    call.usage = Usage(prompt_tokens=2**40, cached_tokens=-3, completion_tokens=7)
    call.status, call.error_type, call.first_byte_at = 99_999, "e" * 100, 10.25
    call.client_request_id = "c" * 300
    row = ledger_row(call, Cost(1, 2, 3, 4, 10, 11, price_id=5))
    assert (len(row.request_id), len(row.key_id or ""), len(row.team or "")) == (64, 64, 200)
    assert (len(row.model or ""), len(row.backend or ""), len(row.error_type or "")) == (
        200, 200, 64)  # fmt: skip
    assert row.values()["ts"] == datetime(2027, 1, 15, 8, 0, 0, 500000, tzinfo=UTC)
    assert (row.status, row.stream, row.ttft_s, row.latency_s) == (32767, True, 0.25, None)
    assert (row.prompt_tokens, row.input_tokens, row.cached_tokens) == (MAX_INT, MAX_INT, 0)
    assert (row.completion_tokens, row.predicted_cached_tokens) == (7, 0)
    assert row[row._fields.index("price_id") : -2] == (5, 1, 2, 3, 4, 10, 11, 0.25, None)
    assert row.client_request_id == "c" * 128
    assert row.end_user is None


def test_the_end_user_is_stored_as_its_keyed_hash_only() -> None:
    """safety_identifier first, else user; the same name under another pepper is another
    hash, and nothing of the name itself is on the row."""
    call = Call(id="r1", path="/v1/chat/completions", received_wall=1_800_000_000.0)
    call.request = Request(endpoint="chat", model="m", body={}, end_user="ada@example.com")
    key = end_user_key("pepper")
    row = ledger_row(call, Cost(), key)
    expected = hmac.new(key, b"ada@example.com", hashlib.sha256).hexdigest()[:32]
    assert row.end_user == expected
    assert ledger_row(call, Cost(), end_user_key("other")).end_user != expected
    assert key.endswith(b"pepper")
    assert key != b"pepper"
    assert "ada@example.com" not in repr(row)


def test_a_call_that_never_got_far_still_has_a_row() -> None:
    call = Call(id="r1", path="/v1/chat/completions", received_wall=1_800_000_000.0)
    call.status, call.error_type = 400, "invalid_request_error"
    row = ledger_row(call, Cost())
    assert (row.key_id, row.team, row.model, row.backend, row.decision) == (None,) * 5
    assert (row.endpoint, row.stream, row.status, row.error_type) == (
        "unknown", False, 400, "invalid_request_error")  # fmt: skip
    assert (row.prompt_tokens, row.cost_total, row.price_id) == (0, 0, None)
    assert row.client_request_id is None
