"""Rates learned from seeded, scattered TTFTs of a backend whose true coefficients are
known: the fits the cost model's and the routing policy's tests reason about."""

import random

from gateway.stages.costs import Rates


def learned(
    seed: int,
    calls: int,
    tokens: tuple[float, float],
    running: tuple[int, int] = (0, 0),
    scatter: float = 0.5,
    truth: tuple[float, float, float] = (0.02, 1e-4, 1e-3),
) -> Rates:
    """Rates fitted to ``calls`` TTFTs of calls with ``tokens`` and ``running`` drawn
    uniformly from the ranges given (nothing running: not drawn), each off the ``truth``
    (overhead, per token, per running sequence) by up to ``scatter`` of it."""
    rng = random.Random(seed)
    rates = Rates()
    overhead, per_token, per_running = truth
    for _ in range(calls):
        t = rng.uniform(*tokens)
        r = rng.randint(*running) if running[1] else 0
        seconds = overhead + per_token * t + per_running * r
        rates.observe(t, r, seconds * rng.uniform(1 - scatter, 1 + scatter))
    return rates
