"""A backend's own error keeps its status, type and code; the older vLLM shape is reshaped."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import UpstreamError

OPENAI_SHAPE = (
    b'{"error": {"message": "too long", "type": "BadRequestError", "param": null, "code": 400}}'
)


def test_an_openai_shaped_error_passes_through_unchanged_with_its_type_and_code() -> None:
    exc = UpstreamError(400, OPENAI_SHAPE)
    assert (exc.status, exc.type, exc.code) == (400, "BadRequestError", "400")
    assert exc.json() == OPENAI_SHAPE


def test_the_older_vllm_shape_is_passed_on_in_openais() -> None:
    old = {"object": "error", "message": "no such model", "type": "NotFoundError",
           "param": "model", "code": 404}  # fmt: skip
    exc = UpstreamError(404, orjson.dumps(old), "application/json; charset=utf-8")
    assert (exc.status, exc.type, exc.code) == (404, "NotFoundError", "404")
    assert orjson.loads(exc.json()) == {
        "error": {
            "message": "no such model",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    assert exc.content_type == "application/json"


@pytest.mark.parametrize(
    "body",
    [
        b"<html>502 Bad Gateway</html>",
        b'{"error": {}}',
        b'["error"]',
        b'{"error": {"type": "a label nobody should get", "code": {"nested": 1}}}',
        b'{"error": {"type": "' + b"x" * 41 + b'"}}',
    ],
)
def test_a_body_without_a_usable_type_is_an_upstream_error_passed_through(body: bytes) -> None:
    exc = UpstreamError(422, body, "text/html")
    assert (exc.status, exc.type, exc.code) == (422, "upstream_error", None)
    assert (exc.json(), exc.content_type) == (body, "text/html")
