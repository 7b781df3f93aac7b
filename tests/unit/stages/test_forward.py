from typing import Any

import orjson

from gateway.flow import Request
from gateway.stages.forward import upstream_body


def _request(body: dict[str, Any], stream: bool, include_usage: bool) -> Request:
    return Request("chat", "m", body, stream=stream, include_usage=include_usage)


def test_body_forwarded_untouched_when_nothing_changes() -> None:
    raw = b'{"model":"m","messages":[]}'
    assert upstream_body(_request({"model": "m"}, False, False), "m", raw) is raw
    assert upstream_body(_request({"model": "m"}, True, True), "m", raw) is raw


def test_stream_always_asks_for_usage_and_model_is_renamed() -> None:
    body = {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": False}}
    out = orjson.loads(upstream_body(_request(body, True, False), "served-m", b""))
    assert out["model"] == "served-m"
    assert out["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert body["stream_options"] == {"continuous_usage_stats": False}
