"""OpenAI's prompt_cache_key pins the calls that name it to one backend, on every replica."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import openai

from tests.e2e.conftest import MODEL, start_sims, write_config
from tests.servers import gateway_process


def test_replicas_send_a_prompt_cache_key_to_the_same_backend(tmp_path: Path) -> None:
    """Two replicas with their own in-process indexes (they share nothing), so only the
    key can bring the calls together: each call's prompt is new to every backend."""
    with ExitStack() as stack:
        sims = start_sims(stack, 3, "--instant")
        clients = []
        for name in ("a", "b"):
            cfg = write_config(tmp_path / f"{name}.yaml", sims)
            url = stack.enter_context(gateway_process("serve", "--config", str(cfg)))
            clients.append(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
        homes: dict[str, set[str]] = {}
        for call in range(24):
            cache_key = f"tenant-{call % 8}"
            raw = clients[call % 2].chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"unrelated question number {call}"}],
                max_tokens=2,
                prompt_cache_key=cache_key,
            )
            assert raw.parse().choices
            homes.setdefault(cache_key, set()).add(raw.headers["x-backend-instance"])
        assert all(len(backends) == 1 for backends in homes.values()), homes
        assert len(set().union(*homes.values())) > 1, "every key on one backend"
