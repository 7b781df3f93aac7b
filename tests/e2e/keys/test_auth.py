"""The official openai client against a gateway with auth on: who gets in, who gets what error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import MODEL, write_config
from tests.e2e.keys.conftest import admin, auth_sections, backend_requests, issue_key
from tests.servers import gateway_process

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def gateway(
    sims: list[str], keys_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    sections = auth_sections(keys_db)
    sections["auth"]["ratelimit_headers"] = True  # off by default: test_limits checks that
    cfg = write_config(tmp_path_factory.mktemp("auth") / "g.yaml", sims, **sections)
    with gateway_process("serve", "--config", str(cfg)) as url:
        yield url


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def call(url: str, key: str, model: str = MODEL) -> None:
    with client(url, key) as c:
        c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2)


def test_a_valid_key_is_served(gateway: str) -> None:
    _, secret = issue_key(gateway, "served")
    call(gateway, secret)


def test_refused_callers_get_openai_errors_and_no_backend_sees_the_call(
    gateway: str, sims: list[str]
) -> None:
    team = f"t{uuid.uuid4().hex[:6]}"
    disabled_id, disabled = issue_key(gateway, team)
    call(gateway, disabled)  # works, and is now in the gateway's key cache
    with admin(gateway) as a:
        assert a.post(f"/admin/keys/{disabled_id}/disable").status_code == 200
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    _, expired = issue_key(gateway, team, expires_at=past)
    _, narrow = issue_key(gateway, team, models=["another-model"])
    before = backend_requests(sims)

    for key, message in [
        ("gk-" + "w" * 43, "Incorrect API key provided"),
        ("sk-proj-somebody-elses-key", "Incorrect API key provided"),
        (disabled, "This API key has been disabled"),
        (expired, "This API key has expired"),
    ]:
        with pytest.raises(openai.AuthenticationError) as info:
            call(gateway, key)
        assert info.value.status_code == 401
        assert info.value.code == "invalid_api_key"
        assert message in info.value.message
        assert key not in info.value.message
    # No Authorization header at all (the openai client always sends one).
    raw = httpx.post(gateway + "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES})
    assert raw.status_code == 401
    assert raw.json()["error"]["code"] == "invalid_api_key"
    assert raw.json()["error"]["message"].startswith("You didn't provide an API key")

    with pytest.raises(openai.NotFoundError) as not_found:
        call(gateway, narrow)
    assert not_found.value.code == "model_not_found"
    assert backend_requests(sims) == before


def test_a_key_limited_to_models_cannot_see_others(gateway: str) -> None:
    _, narrow = issue_key(gateway, "narrow", models=[MODEL])
    call(gateway, narrow)
    with pytest.raises(openai.NotFoundError) as info:
        call(gateway, narrow, model="unlisted-model")
    assert info.value.status_code == 404


def test_models_list_needs_a_key_and_shows_only_the_keys_models(gateway: str) -> None:
    _, narrow = issue_key(gateway, "lister", models=["some-other-model"])
    _, wide = issue_key(gateway, "lister-wide")
    with client(gateway, wide) as c:
        assert [m.id for m in c.models.list().data] == [MODEL]
    with client(gateway, narrow) as c:
        assert c.models.list().data == []
    with client(gateway, "gk-not-a-key") as c, pytest.raises(openai.AuthenticationError):
        c.models.list()


def test_the_admin_api_refuses_ordinary_keys(gateway: str) -> None:
    key_id, secret = issue_key(gateway, "ops")
    listing = httpx.get(gateway + "/admin/keys", headers={"authorization": f"Bearer {secret}"})
    assert listing.status_code == 403
    assert listing.json()["error"]["type"] == "permission_error"
    assert httpx.get(gateway + "/admin/keys").status_code == 401
    with admin(gateway) as a:
        keys = a.get("/admin/keys", params={"team": "ops"}).json()["data"]
    mine = next(k for k in keys if k["id"] == key_id)
    assert mine["prefix"] == secret[:11]
    assert secret not in str(keys)
    with admin(gateway) as a:
        assert a.post("/admin/teams", json={"name": "ops"}).status_code == 400  # exists
        assert a.post("/admin/teams", json={"name": "bad{tag}"}).status_code == 400
        assert a.post("/admin/keys", json={"team": "ghost"}).status_code == 404
        assert a.post("/admin/keys", json={"team": "ops", "rpm": 0}).status_code == 400
        assert a.post("/admin/keys/key_missing/disable").status_code == 404


def test_bad_admin_input_names_the_field_and_shows_no_internals(gateway: str) -> None:
    with admin(gateway) as a:
        typed = a.post("/admin/keys", json={"team": "ops", "rpm": "lots"})
        broken = a.post(
            "/admin/keys", content=b'{"team": ', headers={"content-type": "application/json"}
        )
        query = a.get("/admin/reports/costs", params={"format": "xml"})
    for resp, param in ((typed, "rpm"), (broken, "body"), (query, "format")):
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param)
        assert error["message"].startswith(f"Invalid request: {param}: ")
        assert "File" not in error["message"]
        assert ".py" not in error["message"]
    assert "lots" not in typed.json()["error"]["message"]  # the input is not echoed


def test_served_calls_carry_openais_ratelimit_headers(gateway: str) -> None:
    _, secret = issue_key(gateway, "headers", rpm=100, tpm=100_000)
    with client(gateway, secret) as c:
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=2
        )
    h = raw.headers
    assert h["x-ratelimit-limit-requests"] == "100"
    assert h["x-ratelimit-remaining-requests"] == "99"
    assert h["x-ratelimit-reset-requests"].endswith("ms")
    assert h["x-ratelimit-limit-tokens"] == "100000"
    assert 99_900 < int(h["x-ratelimit-remaining-tokens"]) < 100_000


def test_streamed_calls_carry_the_ratelimit_headers_too(gateway: str) -> None:
    _, secret = issue_key(gateway, "stream-headers", rpm=100, tpm=100_000)
    with (
        client(gateway, secret) as c,
        c.chat.completions.with_streaming_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, stream=True
        ) as raw,
    ):
        assert raw.headers["x-ratelimit-limit-requests"] == "100"
        assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
        assert int(raw.headers["x-ratelimit-remaining-requests"]) < 100
        assert [chunk for chunk in raw.parse()]
