from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.errors import BackendUnavailable
from gateway.flow import PrefixKey, Request, Route
from gateway.index.memory import MemoryIndex
from gateway.settings import PrefixSettings, RoutingSettings
from gateway.stages.costs import Load, Rates, cost
from gateway.stages.prefix import PrefixHasher
from gateway.stages.routing import (
    TIE_ERRORS,
    CacheAware,
    Candidate,
    LeastLoaded,
    RoundRobin,
    make_policy,
)
from tests.clock import Clock
from tests.unit.stages.fits import learned

B = 16


def key(blocks: int, anchor: int = 1, extra_tokens: int = 0) -> PrefixKey:
    return PrefixKey(
        tokens=blocks * B + extra_tokens, hashes=list(range(blocks)), block_size=B, anchor=anchor
    )


def pool(*loads: int, unhealthy: tuple[str, ...] = ()) -> list[Candidate]:
    return [
        Candidate(name=f"b{i}", healthy=f"b{i}" not in unhealthy, in_flight=n)
        for i, n in enumerate(loads)
    ]


def queued(*tokens: float, rates: Rates | None = None) -> list[Candidate]:
    """Backends with these many prompt tokens queued for prefill, at the prior rates."""
    return [
        Candidate(f"b{i}", True, 0, rates=rates or Rates(), ahead=Load(queued_tokens=n))
        for i, n in enumerate(tokens)
    ]


@pytest.fixture
def policy() -> CacheAware:
    return CacheAware(RoutingSettings())


def test_hit_goes_to_the_backend_holding_most_of_the_prompt(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {"b1": 90, "b2": 60}, pool(0, 1, 0))
    assert (route.backend, route.decision) == ("b1", "hit")
    assert route.matched_blocks == 90
    assert route.predicted_cached_tokens == 90 * B
    assert route.uncached_tokens == 10 * B
    assert route.expected_ttft == pytest.approx(Rates().ttft(10 * B, 0))


def test_predicted_tokens_never_exceed_the_prompt(policy: CacheAware) -> None:
    route = policy.choose("m", key(10), {"b0": 10}, pool(0))
    assert route.predicted_cached_tokens == 10 * B


def test_a_long_held_prefix_beats_a_slightly_shorter_queue(policy: CacheAware) -> None:
    """b0 holds 1,600 tokens: staying saves their prefill, which a queue of 500 tokens
    does not outweigh; a queue of 2,000 does."""
    route = policy.choose("m", key(100), {"b0": 100}, queued(500, 0))
    assert (route.backend, route.decision) == ("b0", "hit")
    route = policy.choose("m", key(100), {"b0": 100}, queued(2000, 0))
    assert (route.backend, route.decision, route.predicted_cached_tokens) == ("b1", "overflow", 0)


def test_a_little_more_cache_is_not_worth_a_queue(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {"b0": 100, "b1": 97}, queued(200, 0))
    assert (route.backend, route.decision, route.matched_blocks) == ("b1", "overflow", 97)


def test_overflow_prefers_the_next_best_match(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {"b0": 100, "b2": 80}, queued(3000, 0, 100))
    assert (route.backend, route.decision, route.matched_blocks) == ("b2", "overflow", 80)


def test_miss_goes_to_the_shortest_prefill_queue(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {}, queued(300, 100, 200))
    assert (route.backend, route.decision, route.matched_blocks) == ("b1", "miss", 0)
    assert route.queued_tokens == 100


def test_running_sequences_cost_what_the_backend_learned_they_cost(policy: CacheAware) -> None:
    cands = [
        Candidate("b0", True, 0, ahead=Load(running=40)),
        Candidate("b1", True, 0, ahead=Load(running=5)),
    ]
    assert policy.choose("m", key(10), {}, cands).backend == "b1"


def test_a_slow_backend_gets_proportionally_less() -> None:
    """Two backends, one prefilling at half the other's speed, fed misses of 500 tokens
    faster than either alone could serve them: each routed call joins the chosen queue,
    and each queue drains at its own rate. The fast one takes more than its two thirds of
    the capacity (it answers sooner while it is not saturated), the slow one a fair part."""
    fast, slow = Rates(per_token=1e-4), Rates(per_token=2e-4)
    policy = CacheAware(RoutingSettings())
    backlog = {"fast": 0.0, "slow": 0.0}
    rate = {"fast": fast, "slow": slow}
    picks: Counter[str] = Counter()
    for call in range(600):
        cands = [
            Candidate(n, True, 0, rates=rate[n], ahead=Load(queued_tokens=backlog[n]))
            for n in backlog
        ]
        pick = policy.choose("m", key(31, anchor=call, extra_tokens=4), {}, cands).backend
        picks[pick] += 1
        backlog[pick] += 500
        for name in backlog:  # 40 ms between calls: 400 and 200 tokens drained
            backlog[name] = max(backlog[name] - 0.04 / rate[name].per_token, 0.0)
    assert 0.6 <= picks["fast"] / 600 <= 0.85, picks


def test_a_hot_prefix_held_by_one_busy_backend_is_copied() -> None:
    """Long conversations (6 calls each) all sharing a 2,000-token system prompt that only
    b0 holds: while b0 is lightly used a new conversation saves the prefill there; once
    b0 is busy most of the time, the queueing its 5 later calls would meet there costs more
    than one copy of the prompt elsewhere (Preble's replication)."""
    policy = CacheAware(RoutingSettings())
    for conversation in range(50):  # teach it the conversations' length
        for _ in range(6):
            policy.choose("m", key(4, anchor=1000 + conversation), {}, queued(0, 0))
    light = [
        Candidate("b0", True, 0, ahead=Load(utilization=0.3)),
        Candidate("b1", True, 0, ahead=Load(utilization=0.1)),
    ]
    assert policy.choose("m", key(130, anchor=1), {"b0": 125}, light).backend == "b0"
    busy = [
        Candidate("b0", True, 0, ahead=Load(utilization=0.93)),
        Candidate("b1", True, 0, ahead=Load(utilization=0.1)),
    ]
    route = policy.choose("m", key(130, anchor=2), {"b0": 125}, busy)
    assert (route.backend, route.decision) == ("b1", "overflow")


def test_a_prefix_most_starts_share_is_copied_once_its_holder_is_the_more_loaded() -> None:
    """An agent: every conversation opens on one 1,600-token system prompt, which only b0
    holds, busier over time than b1. For one conversation alone the copy is not worth it
    (b0's load costs its first call about 0.01 s more, against 0.16 s to prefill the
    prompt on b1); for the conversations that share the prompt next it is, and the second
    start on it already says that most will. A prompt that one start in twenty shares
    (the others each on a prompt of its own) is not worth a copy however often it comes."""

    def start(policy: CacheAware, conversation: int, prompt: int = 0) -> str:
        cands = [
            Candidate("b0", True, 0, ahead=Load(utilization=0.4)),
            Candidate("b1", True, 0, ahead=Load(utilization=0.1)),
        ]
        hashes = [*range(prompt, prompt + 100), 10_000 + conversation]  # prompt, then own
        opening = PrefixKey(tokens=101 * B, hashes=hashes, block_size=B, anchor=conversation)
        return policy.choose("m", opening, {"b0": 100} if prompt == 0 else {}, cands).backend

    agent = CacheAware(RoutingSettings())
    assert [start(agent, n) for n in range(2)] == ["b0", "b1"]
    rare = CacheAware(RoutingSettings())
    picks = [start(rare, n, prompt=0 if n % 20 == 0 else n * 1000) for n in range(400)]
    assert {picks[n] for n in range(0, 400, 20)} == {"b0"}


def test_a_shared_prefix_is_not_copied_for_a_momentary_queue() -> None:
    """The same prompt and as many sharers, but both backends equally loaded over time;
    b0 has a queue at this moment that is less than one prefill of the prompt: it clears
    before the next sharer comes, so no copy (the relief rests on utilization)."""
    policy = CacheAware(RoutingSettings())
    cands = [
        Candidate("b0", True, 0, ahead=Load(utilization=0.4, queued_tokens=1000)),
        Candidate("b1", True, 0, ahead=Load(utilization=0.4)),
    ]
    for conversation in range(200):
        hashes = [*range(100), 10_000 + conversation]
        opening = PrefixKey(tokens=101 * B, hashes=hashes, block_size=B, anchor=conversation)
        assert policy.choose("m", opening, {"b0": 100}, cands).backend == "b0"


def test_one_off_calls_on_a_rare_prefix_stay_with_it_however_busy() -> None:
    """Calls that start no conversation (a new question on a shared document each time)
    commit nothing to the backend after them: only this call's TTFT counts, and the held
    1,600 tokens are worth more than any sustained load."""
    policy = CacheAware(RoutingSettings())
    for question in range(1000):
        policy.choose("m", key(4, anchor=question), {}, queued(0, 0))
    busy = [
        Candidate("b0", True, 0, ahead=Load(utilization=0.93)),
        Candidate("b1", True, 0, ahead=Load(utilization=0.0)),
    ]
    assert policy.choose("m", key(100, anchor=999), {"b0": 100}, busy).backend == "b0"


def test_a_conversation_starts_where_the_cache_can_keep_it() -> None:
    """Two backends equally idle, holding the same system prompt, with 16,000 tokens of
    cache each; the conversations live on b0 already want 20,000 of it. A new one (of 4
    calls) starts on b1, where its history will not be evicted between turns."""
    policy = CacheAware(RoutingSettings())
    for turn in range(4):
        for conversation in range(25):
            b0_only = {"b0": 0, "b1": 0} if turn == 0 else {"b0": 60}
            pool_ = [
                Candidate("b0", True, 0),
                Candidate("b1", True, 0, ahead=Load(queued_tokens=10_000)),
            ]
            assert policy.choose("m", key(60, anchor=conversation), b0_only, pool_).backend == "b0"
    cands = [
        Candidate("b0", True, 0, ahead=Load(free_tokens=16_000)),
        Candidate("b1", True, 0, ahead=Load(free_tokens=16_000)),
    ]
    route = policy.choose("m", key(60, anchor=999), {"b0": 30, "b1": 30}, cands)
    assert route.backend == "b1"


def test_a_copy_into_a_full_cache_that_serves_well_costs_what_it_evicts() -> None:
    """b0 holds the prompt behind a queue that outweighs one prefill of it; but b1's cache
    is full, and serves 90% of its prompts: the copy would evict as much as it writes, and
    that would be prefilled again."""
    busy_home = Load(queued_tokens=1300)
    full = Load(full=1.0)
    cands = [
        Candidate("b0", True, 0, rates=Rates(hit_share=0.9), ahead=busy_home),
        Candidate("b1", True, 0, rates=Rates(hit_share=0.9), ahead=full),
    ]
    policy = CacheAware(RoutingSettings())
    for question in range(1000):  # one-off questions: no conversation follows
        policy.choose("m", key(4, anchor=question), {}, queued(0, 0))
    assert policy.choose("m", key(64, anchor=-1), {"b0": 62}, cands).backend == "b0"
    empty = [cands[0], Candidate("b1", True, 0, rates=Rates(hit_share=0.9))]
    assert policy.choose("m", key(64, anchor=-2), {"b0": 62}, empty).backend == "b1"


def test_unhealthy_backends_are_never_chosen(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {"b0": 100}, pool(0, 9, unhealthy=("b0",)))
    assert route.backend == "b1"
    for p in (policy, LeastLoaded(), RoundRobin()):
        for _ in range(3):
            assert p.choose("m", key(5), {}, pool(0, 5, 5, unhealthy=("b0",))).backend != "b0"
        with pytest.raises(BackendUnavailable):
            p.choose("m", key(5), {"b0": 5}, pool(0, unhealthy=("b0",)))


def test_misses_take_turns_among_equally_queued_backends(policy: CacheAware) -> None:
    """Conversations that start together must not share a backend just because it looked
    least loaded for a moment: among equal queues, the one given a new prompt longest ago."""
    picks = [policy.choose("m", key(10, anchor=a), {}, pool(0, 0, 0)).backend for a in range(9)]
    assert (
        Counter(picks[:3])
        == Counter(picks[3:6])
        == Counter(picks[6:])
        == Counter({"b0": 1, "b1": 1, "b2": 1})
    )
    # A shorter prefill queue still comes first.
    assert policy.choose("m", key(10), {}, queued(10, 0, 10)).backend == "b1"


def test_the_first_placements_spread_by_the_anchor() -> None:
    """With nothing placed yet, ties fall to the rendezvous hash, never to "backend 0"."""
    firsts = Counter(
        CacheAware(RoutingSettings()).choose("m", key(10, anchor=a), {}, pool(0, 0, 0)).backend
        for a in range(300)
    )
    assert set(firsts) == {"b0", "b1", "b2"}
    assert min(firsts.values()) > 60


def test_session_pins_when_the_prefix_is_unknown(policy: CacheAware) -> None:
    picks = {
        policy.choose("m", key(10, anchor=a), {}, pool(0, 0, 0), session="alice").backend
        for a in range(20)
    }
    assert len(picks) == 1
    route = policy.choose("m", key(10), {}, pool(0, 0, 0), session="alice")
    assert route.decision == "affinity"
    sessions = {
        policy.choose("m", key(10), {}, pool(0, 0, 0), session=f"s{i}").backend for i in range(30)
    }
    assert len(sessions) == 3


def test_session_yields_to_a_longer_match_and_to_load(policy: CacheAware) -> None:
    pinned = policy.choose("m", key(10), {}, pool(0, 0, 0), session="alice").backend
    other = next(b for b in ("b0", "b1", "b2") if b != pinned)
    assert policy.choose("m", key(10), {other: 10}, pool(0, 0, 0), session="alice").backend == other
    # A short queue does not move it (the pin saves the next call a prefill)...
    loads = [100 if f"b{i}" == pinned else 0 for i in range(3)]
    route = policy.choose("m", key(10), {}, queued(*loads), session="alice")
    assert (route.backend, route.decision) == (pinned, "affinity")
    # ...one costing more than a prefill of the prompt does.
    loads = [5000 if f"b{i}" == pinned else 0 for i in range(3)]
    route = policy.choose("m", key(10), {}, queued(*loads), session="alice")
    assert route.backend != pinned


def test_session_affinity_can_be_switched_off() -> None:
    policy = CacheAware(RoutingSettings(session_affinity=False))
    assert policy.choose("m", key(10), {}, pool(0, 0), session="alice").decision == "miss"


def test_fallback_hashes_the_prefix_when_the_index_is_down(policy: CacheAware) -> None:
    routes = [
        policy.choose("m", key(10, anchor=7), {}, pool(0, 1, 1), index_ok=False) for _ in range(3)
    ]
    assert {r.decision for r in routes} == {"fallback"}
    assert len({r.backend for r in routes}) == 1
    spread = {
        policy.choose("m", key(10, anchor=a), {}, pool(0, 0, 0), index_ok=False).backend
        for a in range(30)
    }
    assert len(spread) == 3
    # What the degraded index still knows is used.
    pinned = policy.choose("m", key(10), {}, pool(0, 0, 0), index_ok=False).backend
    held = next(b for b in ("b0", "b1", "b2") if b != pinned)
    route = policy.choose("m", key(10), {held: 10}, pool(0, 0, 0), index_ok=False)
    assert (route.backend, route.decision) == (held, "hit")


def test_round_robin_cycles_per_model_over_healthy_backends() -> None:
    rr = RoundRobin()
    cands = pool(0, 0, 0, unhealthy=("b1",))
    assert [rr.choose("m", key(1), {}, cands).backend for _ in range(4)] == ["b0", "b2", "b0", "b2"]
    assert rr.choose("other", key(1), {}, cands).backend == "b0"


def test_least_loaded_ignores_the_index_but_reports_what_it_hit() -> None:
    route = LeastLoaded().choose("m", key(10), {"b0": 10, "b1": 4}, pool(1, 0))
    assert (route.backend, route.decision, route.predicted_cached_tokens) == ("b1", "miss", 4 * B)
    assert LeastLoaded().choose("m", key(10), {"b1": 10}, pool(1, 0)).decision == "hit"


def test_make_policy_follows_settings() -> None:
    assert isinstance(make_policy(RoutingSettings()), CacheAware)
    assert isinstance(make_policy(RoutingSettings(policy="round_robin")), RoundRobin)
    assert isinstance(make_policy(RoutingSettings(policy="least_loaded")), LeastLoaded)


@pytest.mark.parametrize("repeats", [25, 200], ids=["250-token", "2000-token"])
async def test_shared_system_prompt_does_not_collapse_conversations_onto_one_backend(
    repeats: int,
) -> None:
    """Multi-turn chats that share a system prompt, run through hasher, index and policy.

    Each of 24 conversations runs 4 turns; a turn's calls arrive together, so each is
    still prefilling when the next arrives (its uncached tokens queue at its backend), and
    the previous turn's calls have completed. A longest-prefix router sends all of them to
    the backend that first saw the system prompt; this policy spreads the conversations
    and keeps every later turn on its conversation's backend. The 2,000-token prompt (an
    agent's) is the case a guard that grows with the match's length fails: valuing a match
    by the tokens it saves put all 24 conversations on one backend.
    """
    hasher = PrefixHasher(PrefixSettings())
    index = MemoryIndex(RoutingSettings(), PrefixSettings())
    policy = CacheAware(RoutingSettings())
    system = {
        "role": "system",
        "content": "You are a careful assistant for a shipping company. " * repeats,
    }
    history = {c: [system] for c in range(24)}
    home: dict[int, str] = {}
    in_flight = Counter({f"b{i}": 0 for i in range(3)})
    decisions: Counter[str] = Counter()
    for turn in range(4):
        prefilling = Counter({name: 0 for name in in_flight})
        for conv, messages in history.items():
            messages.append(
                {
                    "role": "user",
                    "content": f"Chat {conv}, question {turn}: where is parcel {conv * 7 + turn}?",
                }
            )
            k = hasher.key(
                Request(endpoint="chat", model="m", body={"messages": messages}), "cl100k_base"
            )
            cands = [
                Candidate(name, True, n, ahead=Load(queued_tokens=prefilling[name], running=n))
                for name, n in in_flight.items()
            ]
            route = policy.choose("m", k, await index.lookup("m", k.hashes), cands)
            prefilling[route.backend] += route.uncached_tokens
            if turn > 0:
                decisions[route.decision] += 1
                in_flight[home[conv]] -= 1
                assert route.backend == home[conv], (conv, turn, route)
            home[conv] = route.backend
            in_flight[route.backend] += 1
            index.record("m", route.backend, k.hashes)
            messages.append(
                {"role": "assistant", "content": f"Parcel {conv} is in transit, turn {turn}. " * 8}
            )
    per_backend = Counter(home.values())
    spread = [per_backend[name] for name in in_flight]  # backends with none count as 0
    assert max(spread) - min(spread) <= 3, spread
    assert decisions["hit"] == 24 * 3


def test_backends_that_differ_by_estimate_noise_share_new_conversations() -> None:
    """Two backends alike, their rates learned from noisy TTFTs: their estimates differ by
    a few milliseconds of noise, which must not send every new conversation to one."""
    rng = random.Random(3)
    rates = [Rates(), Rates()]
    for r in rates:
        for _ in range(300):
            tokens = rng.uniform(0, 2000)
            r.observe(tokens, 0, (0.02 + 1e-4 * tokens) * rng.uniform(0.5, 1.5))
    assert rates[0].ttft(50, 0) != rates[1].ttft(50, 0)
    policy = CacheAware(RoutingSettings())
    cands = [Candidate(f"b{i}", True, 0, rates=r) for i, r in enumerate(rates)]
    picks = Counter(
        policy.choose("m", key(40, anchor=a), {"b0": 30, "b1": 30}, cands).backend
        for a in range(40)
    )
    assert picks == Counter({"b0": 20, "b1": 20})


def busy_rates(seed: int, slower: float = 1.0) -> Rates:
    """Rates learned on a backend never idle (4-12 sequences beside every call), from TTFTs
    scattered by a fifth: the fit never saw a call with nothing running, and alike
    backends' fits part by several milliseconds there."""
    truth = (0.02 * slower, 1e-4 * slower, 1e-3 * slower)
    return learned(seed, 400, (200, 2000), (4, 12), scatter=0.2, truth=truth)


def starts_after_long_conversations(rates: list[Rates]) -> Counter[str]:
    """Where 40 new conversations start, once the policy has seen conversations of about
    fifteen turns: each start's cost carries fourteen later calls, and with them
    fourteen times whatever the fits miss by at a typical call."""
    clock = Clock()
    policy = CacheAware(RoutingSettings(), clock)
    cands = [Candidate(f"b{i}", True, 0, rates=r) for i, r in enumerate(rates)]
    for turn in range(400):
        clock.now += 1.0
        policy.choose("m", key(2 + turn % 8, anchor=10_000), {}, cands)
    assert policy._streams.later_calls > 10
    return Counter(
        policy.choose("m", key(40, anchor=a), {"b0": 30, "b1": 30}, cands).backend
        for a in range(40)
    )


def test_new_conversations_share_alike_backends_whose_fits_part_where_no_call_was() -> None:
    rates = [busy_rates(0), busy_rates(1)]
    typical = [r.ttft(r.uncached_per_call, 0) for r in rates]
    # Ten later calls part their costs by more than the error of one call's mean.
    assert 10 * abs(typical[0] - typical[1]) > TIE_ERRORS * max(r.error for r in rates)
    picks = starts_after_long_conversations(rates)
    assert abs(picks["b0"] - picks["b1"]) <= 2


def test_new_conversations_still_start_on_a_backend_faster_beyond_the_noise() -> None:
    picks = starts_after_long_conversations([busy_rates(0), busy_rates(1, slower=1.5)])
    assert picks["b0"] == 40


def noisy_rates(seed: int) -> Rates:
    """Rates learned from TTFTs that scatter by half their value: a standard error of ~2 ms."""
    return learned(seed, 300, (0, 2000))


def test_a_new_conversation_whose_costs_tie_goes_where_fewest_conversations_live() -> None:
    """Two idle backends holding the same short system prompt; b0 is home to three live
    conversations, b1 to one. b0's last turn came before b1's, so taking turns alone
    would send a new conversation to b0; the later turns of the three are load to come."""
    policy = CacheAware(RoutingSettings())
    idle = queued(0, 0)
    for conversation, home in ((1, "b0"), (2, "b0"), (3, "b0"), (4, "b1")):
        assert policy.choose("m", key(2, anchor=conversation), {home: 1}, idle).backend == home
    assert policy.choose("m", key(8, anchor=1), {"b0": 7}, idle).backend == "b0"
    assert policy.choose("m", key(8, anchor=4), {"b1": 7}, idle).backend == "b1"
    assert policy.choose("m", key(2, anchor=5), {"b0": 1, "b1": 1}, idle).backend == "b1"


def test_a_later_turn_whose_costs_tie_stays_with_its_history() -> None:
    """Its home's queue costs about what the held history saves: within the estimates'
    error. The tie goes where the history is, not to the backend placed longest ago
    (which spreads conversations that start, and would scatter this one)."""
    policy = CacheAware(RoutingSettings())
    rates = noisy_rates(3)
    alike = [Candidate(f"b{i}", True, 0, rates=rates) for i in range(2)]
    home = policy.choose("m", key(3, anchor=7), {}, alike).backend
    other = "b1" if home == "b0" else "b0"
    history = 16 * B * rates.per_token
    busy_home = [
        Candidate(c.name, True, 0, rates=rates,
                  ahead=Load(queued_tokens=(16 * B + 20) if c.name == home else 0))
        for c in alike
    ]  # fmt: skip
    costs = [rates.ttft(16 * B + 20 + 2 * B, 0), rates.ttft(18 * B, 0)]
    assert 0 < costs[0] - costs[1] < TIE_ERRORS * rates.error < history
    route = policy.choose("m", key(18, anchor=7), {home: 18, other: 2}, busy_home)
    assert (route.backend, route.decision) == (home, "hit")


def test_a_later_turn_leaves_its_history_only_for_more_than_one_call_misses_by() -> None:
    """Rates fitted to TTFTs that scatter by half their value know a typical call's TTFT
    to ~2 ms, one call's only to ~27 ms. A home queue that costs 20 ms more than a
    prefill of the history elsewhere is a saving the fit shows and this one call may well
    not see: the turn stays with its history. A queue worth 100 ms more moves it."""
    policy = CacheAware(RoutingSettings())
    rates = noisy_rates(3)
    alike = [Candidate(f"b{i}", True, 0, rates=rates) for i in range(2)]
    home = policy.choose("m", key(3, anchor=7), {}, alike).backend
    other = "b1" if home == "b0" else "b0"

    def turn(blocks: int, saving: float) -> Route:
        """A turn of ``blocks``: home holds all but two, the other backend two, and home's
        queue costs ``saving`` more than the other's prefill of the history."""
        queue = saving / rates.per_token + (blocks - 4) * B
        here = cost(rates, Load(queued_tokens=queue), 2 * B, 0, 0, 0)
        there = cost(rates, Load(), (blocks - 2) * B, 0, 0, 0)
        assert here - there == pytest.approx(saving)
        cands = [
            Candidate(c.name, True, 0, rates=rates,
                      ahead=Load(queued_tokens=queue) if c.name == home else Load())
            for c in alike
        ]  # fmt: skip
        return policy.choose("m", key(blocks, anchor=7), {home: blocks - 2, other: 2}, cands)

    assert TIE_ERRORS * rates.error < 0.02 < TIE_ERRORS * rates.residual < 0.1
    stays, moves = turn(20, 0.02), turn(22, 0.1)
    assert (stays.backend, stays.decision) == (home, "hit")
    assert (moves.backend, moves.decision) == (other, "overflow")


def test_a_turn_whose_stream_was_forgotten_still_continues_where_its_history_is() -> None:
    """Its conversation was silent for longer than streams remember (three mean gaps), so
    nothing says where it lives but the index: b0 holds its history beyond its opening.
    A later turn leaves its history for a shorter slot wait only by more than the wait
    forecast's error (a start follows the forecast), so it stays rather than prefill its
    history again on b1."""
    clock = Clock()
    policy = CacheAware(RoutingSettings(), clock)
    for _ in range(3):  # a stream's calls 1 s apart
        clock.now += 1.0
        policy.choose("m", key(2, anchor=5), {}, queued(0, 0))
    full = [
        Candidate("b0", True, 8, rates=Rates(slot_error=0.5), ahead=Load(slot_wait=1.0)),
        Candidate("b1", True, 2, ahead=Load()),
    ]
    opened = PrefixKey(tokens=40 * B, hashes=list(range(40)), block_size=B, anchor=7, opening=4 * B)
    assert policy.choose("m", opened, {"b0": 4, "b1": 4}, full).backend == "b1"  # a start
    clock.now += 60.0  # the conversation's stream is forgotten
    later = PrefixKey(tokens=48 * B, hashes=list(range(48)), block_size=B, anchor=7, opening=4 * B)
    route = policy.choose("m", later, {"b0": 40, "b1": 4}, full)
    assert (route.backend, route.decision) == ("b0", "hit")


def test_a_backend_not_yet_timed_is_costed_at_the_timed_ones_rates() -> None:
    """Two CPU servers: b0 answers in 300 ms, b1 has not answered yet. At the prior's
    20 ms b1 would look worth a prefill of the whole history held on b0; at b0's rates
    it is not."""
    policy = CacheAware(RoutingSettings())
    cpu = Rates()
    for tokens in range(0, 2000, 100):
        cpu.observe(tokens, 0, 0.3 + 1e-4 * tokens)
    cands = [Candidate("b0", True, 0, rates=cpu), Candidate("b1", True, 0)]
    assert Rates().ttft(47 * B, 0) < cpu.ttft(7 * B, 0)
    assert policy.choose("m", key(3, anchor=5), {"b0": 3}, cands).backend == "b0"
    route = policy.choose("m", key(47, anchor=5), {"b0": 40, "b1": 2}, cands)
    assert (route.backend, route.decision) == ("b0", "hit")


def test_a_call_avoids_full_slots_a_later_turn_only_beyond_the_forecasts_error(
    policy: CacheAware,
) -> None:
    full = [
        Candidate("b0", True, 8, ahead=Load(slot_wait=1.0)),
        Candidate("b1", True, 2, ahead=Load()),
    ]
    start = policy.choose("m", key(4, anchor=7), {"b0": 4, "b1": 4}, full)
    assert start.backend == "b1"
    assert start.expected_ttft == pytest.approx(Rates().ttft(0, 0))
    # Its next turn: home (b1) now full for a second, against a prefill of 36 blocks.
    history = Rates().ttft(36 * B, 0)
    assert history < 1.0
    held = [
        Candidate("b0", True, 2, ahead=Load()),
        Candidate("b1", True, 8, ahead=Load(slot_wait=1.0)),
    ]
    moved = policy.choose("m", key(40, anchor=7), {"b0": 4, "b1": 40}, held)
    assert (moved.backend, moved.slot_wait) == ("b0", 0.0)
    # The same wait from a forecast that misses by half a second on a call is no saving.
    unsure = Rates(slot_error=0.5)
    held[1] = Candidate("b1", True, 8, rates=unsure, ahead=Load(slot_wait=1.0))
    later = policy.choose("m", key(41, anchor=7), {"b0": 4, "b1": 41}, held)
    assert (later.backend, later.slot_wait) == ("b1", 1.0)


def test_a_lone_healthy_backend_takes_every_call_as_the_weighing_would_label_it() -> None:
    """With one backend left there is nothing to weigh: hit, miss, a session's affinity and
    the degraded index's fallback are labelled as among many, the expected TTFT is the
    cost model's, and the calls still count as streams (for when others come back)."""
    clock = Clock()
    policy = CacheAware(RoutingSettings(), clock=clock)
    lone = [*queued(300.0)[:1], *pool(0, 0, unhealthy=("b1",))[1:]]
    hit = policy.choose("m", key(10, anchor=1), {"b0": 4}, lone)
    assert (hit.backend, hit.decision, hit.matched_blocks) == ("b0", "hit", 4)
    assert hit.expected_ttft == pytest.approx(Rates().ttft(300 + 6 * B, 0))
    assert policy.choose("m", key(10, anchor=2), {}, lone).decision == "miss"
    assert policy.choose("m", key(10, anchor=3), {}, lone, session="s").decision == "affinity"
    assert policy.choose("m", key(10, anchor=4), {}, lone, index_ok=False).decision == "fallback"
    assert policy._streams.live("b0") == 4
