from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest


@pytest.fixture(scope="module")
def client(gateway: str) -> Iterator[openai.OpenAI]:
    """The official client on the module's `gateway` (its base URL)."""
    with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as c:
        yield c
