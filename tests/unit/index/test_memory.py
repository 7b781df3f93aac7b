from __future__ import annotations

import random

from gateway.index.memory import deepest


def test_deepest_agrees_with_a_linear_walk_on_prefix_closed_holdings() -> None:
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(0, 40)
        depth = {f"b{i}": rng.randint(0, n) for i in range(rng.randint(1, 6))}
        probes: list[int] = []

        def holders(i: int, depth: dict[str, int] = depth, probes: list[int] = probes) -> set[str]:
            probes.append(i)
            return {b for b, d in depth.items() if d > i}

        expected = {b: d for b, d in depth.items() if d > 0}
        assert deepest(n, holders) == expected
        distinct = len(set(expected.values())) or 1
        assert len(probes) <= 1 + distinct * max(n, 1).bit_length()


def test_deepest_of_nothing_probes_nothing() -> None:
    assert deepest(0, lambda i: {"b0"}) == {}
