"""The Redis index on a real three-node Redis Cluster: hash tags keep each script in a slot."""

from __future__ import annotations

import redis

from gateway.index import open_index
from gateway.settings import load_settings
from tests.integration.index.redis_servers import RedisProcess

MODELS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
A = list(range(1, 30))


async def test_lookups_records_and_capacity_on_a_cluster(cluster: list[RedisProcess]) -> None:
    settings = load_settings(
        redis={"url": f"redis://127.0.0.1:{cluster[0].port}/0", "cluster": True},
    )
    index = open_index(settings)
    index.bound("b0", 20 * 16)
    await index.start()
    try:
        for model in MODELS:
            index.record(model, "b0", A)
            index.record(model, "b1", A[:5])
        index.forget("alpha", "b0", A, keep_blocks=3)
        await index.flush()
        assert index.healthy
        assert await index.lookup("alpha", A) == {"b0": 3, "b1": 5}
        for model in MODELS[1:]:
            assert await index.lookup(model, A) == {"b0": 20, "b1": 5}
        assert await index.size() == 8 + 25 * 5
        assert index.healthy
    finally:
        await index.aclose()
    # The models' keys really are spread over the nodes.
    holding = 0
    for node in cluster:
        client = redis.Redis(port=node.port)
        holding += client.dbsize() > 0
        client.close()
    assert holding >= 2
