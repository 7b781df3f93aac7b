from __future__ import annotations

import random

from gateway.index.memory import deepest


def test_deepest_agrees_with_a_linear_walk_on_prefix_closed_holdings() -> None:
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(0, 40)
        depth = {f"b{i}": rng.randint(0, n) for i in range(rng.randint(1, 6))}
        probes: list[int] = []

        def holds(
            b: str, i: int, depth: dict[str, int] = depth, probes: list[int] = probes
        ) -> bool:
            probes.append(i)
            return depth[b] > i

        expected = {b: d for b, d in depth.items() if d > 0}
        assert deepest(n, set(depth), holds) == expected
        # Block 0 for every backend, then a binary search for each that holds it.
        assert len(probes) <= len(depth) + len(expected) * max(n, 1).bit_length()


def test_deepest_of_nothing_probes_nothing() -> None:
    assert deepest(0, {"b0"}, lambda b, i: True) == {}
