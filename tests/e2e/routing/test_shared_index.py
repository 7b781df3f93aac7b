"""Gateway replicas share one Redis index; Redis going away loses no call."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from pathlib import Path

import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import MODEL, start_sims, write_config
from tests.integration.index.redis_servers import RedisProcess
from tests.servers import gateway_process

SYSTEM = "You are a terse assistant. " * 4
OPENING = " ".join(f"fact{i}" for i in range(250))


def converse(clients: list[openai.OpenAI], turns: int) -> list[tuple[str, int, int]]:
    """One conversation, each turn through the next client: (backend, cached, prompt)."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": OPENING},
    ]
    seen = []
    for turn in range(turns):
        client = clients[turn % len(clients)]
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            max_tokens=8,
        )
        resp = raw.parse()
        assert resp.usage is not None
        details = resp.usage.prompt_tokens_details
        cached = details.cached_tokens if details and details.cached_tokens else 0
        seen.append((raw.headers["x-backend-instance"], cached, resp.usage.prompt_tokens))
        messages += [
            {"role": "assistant", "content": resp.choices[0].message.content or ""},
            {"role": "user", "content": f"and then {turn}?"},
        ]
    return seen


def test_two_replicas_route_a_conversation_to_one_backend(
    redis_server_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        sims = start_sims(stack, 3)
        clients = []
        for name in ("a", "b"):
            cfg = write_config(
                tmp_path / f"{name}.yaml",
                sims,
                redis={"url": redis_server_url, "key_prefix": redis_prefix},
            )
            url = stack.enter_context(gateway_process("serve", "--config", str(cfg)))
            clients.append(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
        for _ in range(3):
            seen = converse(clients, turns=4)
            backends = {b for b, _, _ in seen}
            assert len(backends) == 1, f"a conversation was split across {backends}"
            assert all(cached > prompt // 2 for _, cached, prompt in seen[1:]), seen


def test_redis_killed_and_restarted_mid_traffic_loses_no_call(tmp_path: Path) -> None:
    redis = RedisProcess()
    redis.start()
    with ExitStack() as stack:
        stack.callback(redis.kill)
        sims = start_sims(stack, 2, "--instant")
        cfg = write_config(
            tmp_path / "g.yaml",
            sims,
            redis={"url": f"redis://127.0.0.1:{redis.port}/0", "probe_interval": 0.2},
        )
        url = stack.enter_context(gateway_process("serve", "--config", str(cfg)))
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        results: list[bool] = []
        stop = threading.Event()

        def traffic() -> None:
            i = 0
            while not stop.is_set() and i < 2000:
                resp = client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"{OPENING} question {i % 7}"}],
                    max_tokens=2,
                )
                results.append(bool(resp.choices))
                i += 1

        worker = threading.Thread(target=traffic)
        worker.start()
        try:
            time.sleep(0.5)
            redis.kill()
            during = len(results)
            time.sleep(1.0)
            assert len(results) > during, "calls stopped flowing while Redis was down"
            redis.start()
            restarted = len(results)
            time.sleep(1.0)
            assert len(results) > restarted
        finally:
            stop.set()
            worker.join(timeout=30)
        assert not worker.is_alive()
        assert results
        assert all(results)
