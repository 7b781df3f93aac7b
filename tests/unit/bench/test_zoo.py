"""The zoo's capacity model: arithmetic from the simulator's costs, and every scenario sane."""

from __future__ import annotations

import pytest

from gateway.bench import zoo
from gateway.bench.runner import Bursts
from gateway.bench.workloads import MultiTurn, SharedPrefix
from gateway.sim.config import SimConfig

CONFIG = SimConfig(cache_blocks=1000, max_num_seqs=8)


def test_profile_counts_what_an_ideal_router_leaves_uncached() -> None:
    # Two groups of 100-word system prompts, 10-word questions: after the two first sights
    # only a question (and the template) is new; the system prompt is shared, not private.
    w = SharedPrefix(groups=2, prefix_words=100, questions=50, question_words=10, max_tokens=4)
    p = zoo.profile(w, turns=100)
    question = 10 + zoo.MESSAGE_TOKENS + 6
    system = 100 + zoo.MESSAGE_TOKENS
    assert p.prompt == system + question
    assert p.new == pytest.approx(question + 2 * system / 100)
    assert p.private == question + 4
    assert p.output == 4


def test_profile_of_a_conversation_grows_its_prompt_but_not_its_new_tokens() -> None:
    w = MultiTurn(conversations=1, turns_per_conversation=3, system_words=5,
                  message_words=20, max_tokens=8)  # fmt: skip
    p = zoo.profile(w, turns=3)
    message = 20 + zoo.MESSAGE_TOKENS
    turn = message + 8 + zoo.MESSAGE_TOKENS  # a question and its answer, resent later
    system = 5 + zoo.MESSAGE_TOKENS
    assert p.prompt == pytest.approx(system + 6 + message + turn)  # mean of 0, 1, 2 turns
    assert p.new == pytest.approx(message + 6 + system / 3)


def test_capacity_follows_the_simulator_cost_model() -> None:
    p = zoo.Profile(prompt=1000, new=100, private=500, output=40)
    # batch: 8 sequences (16,000 KV tokens would hold 32); a call costs 10 ms of prefill
    # and 40 decode steps of 12/8 + 0.05 ms.
    cost = 0.1 * 100 + 40 * (12 / 8 + 0.05)
    assert zoo.call_cost_ms(p, CONFIG) == pytest.approx(cost)
    assert zoo.capacity(p, CONFIG, (1, 1, 1, 0.5)) == pytest.approx(3.5 * 1000 / cost)
    # the KV cache limits the batch when private tokens would overflow it
    big = zoo.Profile(prompt=8000, new=100, private=8000, output=40)
    wide = SimConfig(cache_blocks=1000, max_num_seqs=64)
    assert zoo.call_cost_ms(big, wide) == pytest.approx(10 + 40 * (12 / 2 + 0.05))


def test_rate_is_the_load_share_of_capacity() -> None:
    s = zoo.ZOO["multi-turn"]
    full = zoo.capacity(zoo.profile(s.workload), CONFIG, (1.0,) * 4)
    assert zoo.rate(s, CONFIG, 4, seed=0) == pytest.approx(s.load * full)
    assert zoo.rate(s, CONFIG, 4, load=0.5, seed=0) == pytest.approx(0.5 * full)
    slow = zoo.ZOO["slow-backend"]
    assert zoo.rate(slow, CONFIG, 4, load=1.0, seed=0) == pytest.approx(full * 3.5 / 4)
    with pytest.raises(ValueError, match="4 speeds for 3 instances"):
        zoo.rate(slow, CONFIG, 3, seed=0)


def test_rate_is_profiled_on_the_seed_replayed() -> None:
    # tenants draw each seed's prompt and answer lengths: one rate for every seed would
    # load the cluster at 0.71-0.92 of capacity instead of the scenario's 0.8
    s = zoo.ZOO["tenants"]
    for seed in (0, 1, 2, 3):
        full = zoo.capacity(zoo.profile(s.workload, seed), CONFIG, (1.0,) * 4)
        assert zoo.rate(s, CONFIG, 4, seed=seed) == pytest.approx(s.load * full)
    assert zoo.rate(s, CONFIG, 4, seed=3) < 0.9 * zoo.rate(s, CONFIG, 4, seed=2)


def test_every_scenario_loads_the_cluster_between_half_and_nine_tenths() -> None:
    for s in zoo.ZOO.values():
        peak = s.load * (s.bursts.factor if s.bursts else 1.0)
        assert 0.5 <= peak <= 0.9, s.name
        assert zoo.rate(s, CONFIG, 4, seed=0) > 0
    assert zoo.ZOO["bursts"].bursts == Bursts(length=10, factor=2)
    assert not zoo.ZOO["slow-backend"].balanceable
