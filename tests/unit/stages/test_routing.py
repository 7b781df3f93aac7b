from __future__ import annotations

from collections import Counter

import pytest

from gateway.errors import BackendUnavailable
from gateway.flow import PrefixKey, Request
from gateway.index.memory import MemoryIndex
from gateway.settings import PrefixSettings, RoutingSettings
from gateway.stages.prefix import PrefixHasher
from gateway.stages.routing import (
    CacheAware,
    Candidate,
    LeastLoaded,
    Popularity,
    RoundRobin,
    make_policy,
)

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


@pytest.fixture
def policy() -> CacheAware:
    """Matches valued by share alone: no prompt here reaches long_match_tokens."""
    return CacheAware(RoutingSettings(load_slack=4, min_match_share=0.5, long_match_tokens=10_000))


def distinct(blocks: int, seed: int) -> PrefixKey:
    """A prompt that shares no block with key() or with another seed's."""
    return PrefixKey(
        tokens=blocks * B, hashes=[seed * 10_000 + i for i in range(blocks)], block_size=B
    )


def test_hit_goes_to_the_backend_holding_most_of_the_prompt(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {"b1": 90, "b2": 60}, pool(0, 1, 0))
    assert (route.backend, route.decision) == ("b1", "hit")
    assert route.matched_blocks == 90
    assert route.predicted_cached_tokens == 90 * B


def test_a_little_more_cache_is_not_worth_a_queue(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {"b0": 100, "b1": 97}, pool(3, 0))
    assert (route.backend, route.decision, route.matched_blocks) == ("b1", "overflow", 97)
    assert policy.choose("m", key(100), {"b1": 90, "b2": 60}, pool(0, 2, 0)).backend == "b2"


def test_predicted_tokens_never_exceed_the_prompt(policy: CacheAware) -> None:
    route = policy.choose("m", key(10), {"b0": 10}, pool(0))
    assert route.predicted_cached_tokens == 10 * B


def test_miss_goes_to_the_least_loaded(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {}, pool(3, 1, 2))
    assert (route.backend, route.decision, route.matched_blocks) == ("b1", "miss", 0)


def test_a_full_match_keeps_the_call_within_the_slack(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {"b0": 100}, pool(4, 0))
    assert (route.backend, route.decision) == ("b0", "hit")


def test_overloaded_match_overflows_to_the_least_loaded(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {"b0": 100}, pool(5, 0, 1))
    assert (route.backend, route.decision) == ("b1", "overflow")
    assert route.predicted_cached_tokens == 0


def test_overflow_prefers_the_next_best_match(policy: CacheAware) -> None:
    route = policy.choose("m", key(100), {"b0": 100, "b2": 80}, pool(6, 0, 1))
    assert (route.backend, route.decision, route.matched_blocks) == ("b2", "overflow", 80)


def test_the_guard_tightens_with_a_smaller_share(policy: CacheAware) -> None:
    # 60% of the prompt: allowed 0.6 * 4 = 2.4 requests above the least loaded.
    assert policy.choose("m", key(100), {"b0": 60}, pool(2, 0)).backend == "b0"
    assert policy.choose("m", key(100), {"b0": 60}, pool(3, 0)).backend == "b1"


def test_a_long_match_on_a_rare_prefix_earns_a_longer_queue() -> None:
    """1,600 tokens against a unit of 400 are worth 4 prompts when few calls share them:
    the call stays within 4 * load_slack = 16 requests. The same prompt once most calls
    share it keeps the plain guard of 4, so that it spreads."""
    policy = CacheAware(RoutingSettings(load_slack=4, long_match_tokens=400))
    for seed in range(1, 21):  # other traffic: 20 prompts of their own
        policy.choose("m", distinct(100, seed), {}, pool(0, 0))
    assert policy.choose("m", key(100), {"b0": 100}, pool(16, 0)).decision == "hit"
    assert policy.choose("m", key(100), {"b0": 100}, pool(17, 0)).backend == "b1"
    short = distinct(25, 99)  # 400 tokens: not long
    assert policy.choose("m", short, {"b0": 25}, pool(4, 0)).decision == "hit"
    assert policy.choose("m", short, {"b0": 25}, pool(5, 0)).backend == "b1"
    for _ in range(30):  # now the long prompt is most of the traffic
        policy.choose("m", key(100), {}, pool(0, 0))
    assert policy.choose("m", key(100), {"b0": 100}, pool(4, 0)).decision == "hit"
    assert policy.choose("m", key(100), {"b0": 100}, pool(5, 0)).backend == "b1"


def test_popularity_forgets_after_two_windows() -> None:
    now = [0.0]
    popular = Popularity(400, 10.0, lambda: now[0])
    popular.count(key(100))
    popular.count(distinct(100, 1))
    assert popular.share(key(100), 100) == 0.5
    assert popular.share(key(100), 24) == 0.0  # below the first counted depth (25 blocks)
    now[0] = 15.0  # the previous window still counts
    popular.count(distinct(100, 2))
    assert popular.share(key(100), 100) == pytest.approx(1 / 3)
    now[0] = 25.0
    popular.count(distinct(100, 3))
    assert popular.share(key(100), 100) == 0.0
    now[0] = 100.0  # idle: nothing older is kept
    popular.count(key(100))
    assert popular.share(key(100), 100) == 1.0


def test_a_weak_match_counts_as_a_miss(policy: CacheAware) -> None:
    # Only a shared system prompt (20% of this prompt) matches b0: not worth a queue.
    route = policy.choose("m", key(100), {"b0": 20}, pool(1, 0))
    assert (route.backend, route.decision) == ("b1", "miss")


def test_queue_and_kv_usage_count_as_load(policy: CacheAware) -> None:
    cands = [
        Candidate("b0", True, in_flight=0, waiting=6),
        Candidate("b1", True, in_flight=1, kv_usage=0.9),
        Candidate("b2", True, in_flight=1, kv_usage=0.2),
    ]
    assert policy.choose("m", key(10), {}, cands).backend == "b2"


def test_weight_scales_load(policy: CacheAware) -> None:
    cands = [Candidate("b0", True, in_flight=4, weight=4.0), Candidate("b1", True, in_flight=2)]
    assert policy.choose("m", key(10), {}, cands).backend == "b0"


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
    # KV usage orders backends no more than that: the freshest placement still waits.
    cands = [
        Candidate("b0", True, in_flight=1, kv_usage=0.1),
        Candidate("b1", True, in_flight=1, kv_usage=0.9),
        Candidate("b2", True, in_flight=1, kv_usage=0.5),
    ]
    fresh = CacheAware(RoutingSettings())
    assert [fresh.choose("m", key(10, anchor=a), {}, cands).backend for a in range(3)] == [
        "b0",
        "b2",
        "b1",
    ]
    # Fewer requests queued still comes first.
    assert fresh.choose("m", key(10), {}, [*cands[:2], Candidate("b2", True, 0)]).backend == "b2"


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


def test_session_yields_to_a_strong_match_and_to_load(policy: CacheAware) -> None:
    pinned = policy.choose("m", key(10), {}, pool(0, 0, 0), session="alice").backend
    other = next(b for b in ("b0", "b1", "b2") if b != pinned)
    assert policy.choose("m", key(10), {other: 10}, pool(0, 0, 0), session="alice").backend == other
    loads = [9 if f"b{i}" == pinned else 0 for i in range(3)]
    route = policy.choose("m", key(10), {}, pool(*loads), session="alice")
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
    assert policy.choose("m", key(10), {"b2": 10}, pool(0, 0, 0), index_ok=False).decision == "hit"


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

    Each of 24 conversations runs 4 turns; a turn adds one call in flight at its backend
    and the previous turn's call completes. A longest-prefix router sends all of them to
    the backend that first saw the system prompt; this policy spreads the conversations
    and keeps every later turn on its conversation's backend. The 2,000-token prompt (an
    agent's) is the case a guard that grows with the match's length fails: valuing a match
    by the tokens it saves (share x tokens / 512) put all 24 conversations on one backend.
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
            cands = [Candidate(name, True, n) for name, n in in_flight.items()]
            route = policy.choose("m", k, await index.lookup("m", k.hashes), cands)
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
