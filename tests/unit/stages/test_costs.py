import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.flow import Call, PrefixKey, Route, Usage
from gateway.stages.costs import (
    MEMORY,
    PRIOR_PER_TOKEN,
    Load,
    Rates,
    Sharing,
    Streams,
    cost,
    crowding,
    evicted,
    relief,
    slot_wait,
)
from gateway.stages.dispatch import time_rates
from tests.unit.stages.fits import learned


def test_rates_start_at_the_priors() -> None:
    assert Rates().ttft(1000, 0) == pytest.approx(0.02 + 1000 * PRIOR_PER_TOKEN)


def test_rates_learn_a_backend_from_its_ttfts() -> None:
    """A backend twice as slow as the prior with a 50 ms overhead, timed with noise."""
    rates = learned(1, 600, (0, 4000), (0, 30), scatter=0.1, truth=(0.05, 2e-4, 1e-3))
    assert rates.per_token == pytest.approx(2e-4, rel=0.1)
    assert rates.overhead == pytest.approx(0.05, abs=0.015)
    assert rates.per_running == pytest.approx(1e-3, rel=0.3)


def test_one_stuck_call_barely_moves_the_rates() -> None:
    rng = random.Random(2)
    rates = Rates()
    for _ in range(300):
        tokens = rng.uniform(0, 2000)
        rates.observe(tokens, 0, 0.02 + 1e-4 * tokens)
    before = rates.per_token
    rates.observe(100, 0, 5.0)  # behind another replica's burst
    assert rates.per_token == pytest.approx(before, rel=0.05)


def test_calls_that_all_look_alike_keep_the_prior_slope() -> None:
    rates = Rates()
    for _ in range(500):
        rates.observe(32, 0, 0.015)  # all hits: 32 tokens to prefill
    assert rates.ttft(32, 0) == pytest.approx(0.015, rel=0.1)
    assert rates.per_token == pytest.approx(PRIOR_PER_TOKEN, rel=0.5)


def test_a_prediction_is_as_sure_as_the_calls_near_it() -> None:
    """Fitted on calls of 500-1,500 tokens beside 5-15 running sequences: where they were,
    the mean TTFT is known to about the residual over the square root of a memory of
    calls; a call with nothing to prefill and nothing running lies outside them all, and
    there the intercept's error is several times that."""
    rates = learned(4, 600, (500, 1500), (5, 15))
    centre = rates.error_at(1000, 10)
    assert centre == pytest.approx(rates.residual / math.sqrt(MEMORY), rel=0.3)
    assert rates.error_at(0, 0) > 3 * centre
    assert Rates().error_at(1000, 10) == 0.0  # the prior, the same on every backend


def test_streams_count_the_calls_that_follow_a_first_and_the_gap() -> None:
    now = [0.0]
    streams = Streams(lambda: now[0])
    for conversation in range(200):
        for turn in range(6):
            now[0] += 0.5
            home = streams.count(conversation)
            assert (home is None) == (turn == 0)
            streams.place(conversation, "b0", 100)
    assert streams.later_calls == pytest.approx(5, rel=0.1)
    assert streams.gap == pytest.approx(0.5)
    for question in range(10_000, 12_000):
        streams.count(question)
    assert streams.later_calls < 0.05


def test_streams_know_what_each_backend_will_want_cached() -> None:
    now = [0.0]
    streams = Streams(lambda: now[0])
    for conversation in range(3):
        streams.count(conversation)
        streams.place(conversation, "b0", 1000)
    streams.count(0)
    streams.place(0, "b1", 1500)  # moved, and grew
    assert (streams.footprint("b0"), streams.footprint("b1")) == (2000, 1500)
    assert (streams.live("b0"), streams.live("b1"), streams.live("b2")) == (2, 1, 0)
    # Once the mean gap is known, a stream unseen for three of them has ended.
    now[0] = 1.0
    streams.count(1)
    streams.place(1, "b0", 1000)
    assert streams.gap == pytest.approx(0.5)  # 0 and 1 s after their last calls
    now[0] = 1.6
    streams.count(99)
    assert (streams.footprint("b0"), streams.footprint("b1")) == (1000, 0)
    assert (streams.live("b0"), streams.live("b1")) == (1, 0)


def test_streams_remember_at_most_their_bound_however_many_conversations_start() -> None:
    now = [0.0]
    streams = Streams(lambda: now[0], remembered=100)
    for conversation in range(1_000):  # no gap learned yet: nothing expires by age
        streams.count(conversation)
        streams.place(conversation, f"b{conversation % 2}", 10)
        assert len(streams._homes) <= 100
    assert streams.count(999) is not None
    assert streams.count(0) is None
    # what the forgotten streams wanted cached left the footprints with them
    assert streams.footprint("b0") + streams.footprint("b1") == pytest.approx(100 * 10)


def test_sharing_expects_the_share_of_recent_starts_on_a_prefix_of_those_to_come() -> None:
    sharing = Sharing()
    assert sharing.count(7) == 0.0  # the first start: none before it to go by
    keep = 1 - 1 / MEMORY  # each start since weighs a count down by this
    # Every start so far shared it: so will about a memory's worth of those to come, from
    # the second start on (counted alone, the few seen would stand for all to come).
    assert [sharing.count(7) for _ in range(2)] == pytest.approx([keep * MEMORY] * 2)
    assert sharing.count(None) == 0.0
    # three of the four starts before this one shared it
    assert sharing.count(7) == pytest.approx(0.75 * MEMORY, rel=0.01)
    for _ in range(10 * MEMORY):  # starts on other prompts: the prefix is no longer hot
        sharing.count(None)
    assert sharing.count(7) < 0.01
    for _ in range(2 * MEMORY):  # one prefix under every start: about a memory's worth
        sharing.count(8)
    assert sharing.count(8) == pytest.approx(MEMORY, rel=0.2)


def test_sharing_remembers_at_most_its_bound() -> None:
    sharing = Sharing(remembered=10)
    for prefix in range(100):
        sharing.count(prefix)
        assert len(sharing._counts) <= 10
    assert sharing.count(0) == 0.0  # forgotten
    keep = 1 - 1 / MEMORY
    # counted once, two starts since, of the 101 before it
    assert sharing.count(99) == pytest.approx(keep**2 / (1 - keep**101))


def test_a_copy_relieves_the_sharers_of_the_holders_sustained_load_only() -> None:
    rates = Rates()
    busy, idle = Load(utilization=0.5), Load()
    own = 200  # tokens each sharer has beyond the prefix
    gap = rates.ttft(own, 0) * (1 + crowding(busy)) - rates.ttft(own, 0) * (1 + crowding(idle))
    assert gap == pytest.approx(rates.overhead + rates.per_token * own)
    # 10 sharers, one holder: two backends share them once copied, half meet this one,
    # and as they come the loads draw together: each saves half the gap
    assert relief(10, [(rates, busy)], rates, idle, own) == pytest.approx(10 / 2 * gap / 2)
    assert relief(10, [(rates, busy), (rates, idle)], rates, idle, own) == pytest.approx(
        10 / 3 * gap / 4
    )
    assert relief(10, [(rates, idle)], rates, busy, own) == 0.0  # it is the busier one
    assert relief(10, [(rates, busy)], rates, busy, own) == 0.0  # even: a copy relieves nobody
    momentary = Load(queued_tokens=5000)
    assert relief(10, [(rates, momentary)], rates, idle, own) == 0.0
    assert relief(0, [(rates, busy)], rates, idle, own) == 0.0
    # what the holder's other calls usually prefill is not the sharers' shape
    inflated = Rates(uncached_per_call=5000)
    assert relief(10, [(inflated, busy)], rates, busy, own) == 0.0


def test_a_copy_relieves_queueing_not_a_difference_of_fits() -> None:
    """Alike backends whose fits differ (one's overhead a tenth of the other's, its slope
    making up for it), equally loaded near saturation: a copy relieves nobody."""
    near_full = Load(utilization=0.97)
    fitted_high = Rates(overhead=0.16, per_token=1.8e-4)
    fitted_low = Rates(overhead=0.006, per_token=2.2e-4)
    own = 56
    high, low = (r.ttft(own, 0) * (1 + crowding(near_full)) for r in (fitted_high, fitted_low))
    assert high - low > 2.0
    assert relief(6, [(fitted_high, near_full)], fitted_low, near_full, own) == 0.0
    # a less loaded backend: the queueing it saves, at its own service
    calmer = Load(utilization=0.5)
    service = fitted_low.overhead + fitted_low.per_token * own
    assert relief(6, [(fitted_high, near_full)], fitted_low, calmer, own) == pytest.approx(
        6 / 2 * service * (crowding(near_full) - crowding(calmer)) / 2
    )


def test_an_lru_cache_loses_more_the_more_the_live_streams_want() -> None:
    assert evicted(free_tokens=10_000, wanted=0) == 0.0
    assert evicted(free_tokens=10_000, wanted=1_000) == pytest.approx(math.exp(-10))
    assert evicted(free_tokens=10_000, wanted=10_000) == pytest.approx(math.exp(-1))
    assert evicted(free_tokens=0, wanted=1) == 1.0


def test_cost_adds_the_later_calls_queueing_and_eviction() -> None:
    rates = Rates()
    busy = Load(utilization=0.5)
    assert cost(rates, busy, 100, 0, 500, 0) == pytest.approx(
        rates.ttft(0, 0) + rates.per_token * 100 * 2
    )  # a call no other follows: its own TTFT, and its prefill delays one call behind it
    service = rates.overhead + rates.per_token * rates.uncached_per_call
    idle = cost(rates, Load(), 100, 5, 500, 0)
    assert idle == pytest.approx(rates.ttft(100, 0) + 5 * service)
    assert cost(rates, busy, 100, 5, 500, 0) - cost(rates, busy, 100, 0, 500, 0) == (
        pytest.approx(5 * service * 2)
    )  # each later call's own TTFT at utilization 0.5: twice its service
    full = cost(rates, Load(free_tokens=2000), 100, 5, 500, 1500)
    assert full - idle == pytest.approx(5 * rates.per_token * 500 * math.exp(-1))
    assert cost(rates, Load(utilization=1.0), 100, 5, 500, 0) < float("inf")
    reused = Rates(hit_share=0.8)
    written = cost(reused, Load(full=0.5), 100, 0, 0, 0) - cost(reused, Load(), 100, 0, 0, 0)
    assert written == pytest.approx(reused.per_token * 100 * 0.5 * 0.8)


def test_no_slot_wait_while_a_slot_is_free_or_the_count_unknown() -> None:
    assert slot_wait([3.0, 2.0], [], slots=3) == 0.0
    assert slot_wait([3.0, 2.0, 1.0], [5.0], slots=0) == 0.0


def test_a_call_beyond_the_slots_waits_for_the_first_running_answer_to_end() -> None:
    assert slot_wait([3.0, 2.0, 1.0], [], slots=3) == 1.0


def test_calls_queued_ahead_take_the_slots_that_free_first() -> None:
    # Slots free at 1 and 2; the two queued ahead take them until 1 + 4 and 2 + 0.5.
    assert slot_wait([1.0, 2.0], [4.0, 0.5], slots=2) == 2.5


def admissions(running: list[float], waiting: list[float], slots: int) -> float:
    """The engine's admissions played out in full: every slot, every call queued ahead."""
    ends = sorted(running)[:slots] + [0.0] * max(slots - len(running), 0)
    for held in waiting:
        ends.sort()
        ends[0] += held
    return min(ends)


seconds = st.floats(0, 30, allow_nan=False)


@given(st.lists(seconds, max_size=40), st.lists(seconds, max_size=40), st.integers(1, 16))
def test_the_slot_wait_looks_only_at_the_ends_that_can_matter(
    running: list[float], waiting: list[float], slots: int
) -> None:
    expected = admissions(running, waiting, slots) if len(running) + len(waiting) >= slots else 0
    assert slot_wait(running, waiting, slots) == expected


def test_the_slot_wait_weighs_on_every_call() -> None:
    assert (
        cost(Rates(), Load(slot_wait=1.5), 100, 0, 0, 0) - cost(Rates(), Load(), 100, 0, 0, 0)
        == 1.5
    )


def test_a_start_that_waits_for_a_slot_delays_the_calls_queued_behind_it_by_its_hold() -> None:
    """Eight slots serve as one server eight times as fast: each call queued behind it
    waits an eighth of its hold longer, and at utilization 0.8 four calls are. A later
    turn (no later calls) waits, and that is all."""
    rates = Rates()
    hold = rates.hold(100, rates.completion_per_call, rates.per_output)
    full = Load(slot_wait=1.5, slots=8, utilization=0.8)
    free = Load(slots=8, utilization=0.8)
    extra = cost(rates, full, 100, 5, 0, 0) - cost(rates, free, 100, 5, 0, 0)
    assert extra == pytest.approx(1.5 + 4 * hold / 8)
    assert cost(rates, full, 100, 0, 0, 0) - cost(rates, free, 100, 0, 0, 0) == 1.5


def test_the_hold_behind_a_full_backend_is_at_the_pace_its_slot_wait_was_forecast_at() -> None:
    """A full engine decodes slower than the learned pace: the hold a start adds to the
    queue behind it is at the pace its slot wait says, not at the learned one."""
    rates = Rates()
    slow = Load(slot_wait=1.5, slots=8, utilization=0.8, pace=4 * rates.per_output)
    learned = Load(slot_wait=1.5, slots=8, utilization=0.8)
    extra = cost(rates, slow, 100, 5, 0, 0) - cost(rates, learned, 100, 5, 0, 0)
    assert extra == pytest.approx(4 * 3 * rates.per_output * rates.completion_per_call / 8)


def test_a_prefill_holds_up_every_answer_running_beside_it() -> None:
    """Each step that prefills it decodes the running sequences that much later."""
    rates = Rates()
    idle, busy = cost(rates, Load(), 100, 0, 0, 0), cost(rates, Load(running=8), 100, 0, 0, 0)
    assert busy - idle == pytest.approx(rates.per_running * 8 + rates.per_token * 100 * 8)
    assert cost(rates, Load(running=8), 0, 0, 0, 0) == rates.ttft(0, 8)  # nothing to prefill


def test_the_decode_pace_is_learned_and_sets_how_long_a_call_holds_its_slot() -> None:
    rates = Rates()
    for _ in range(50):
        rates.decoded(0.05)
    assert rates.per_output == pytest.approx(0.05)
    assert rates.hold(0, 100, rates.per_output) == pytest.approx(rates.overhead + 5.0)


def test_only_a_call_expected_to_find_a_slot_teaches_the_ttft_fit() -> None:
    """A call that waited for a slot took the slot-wait estimate's error into its TTFT;
    fit on, an overestimated wait makes a long queue look free."""
    rates = Rates()
    key = PrefixKey(tokens=200, hashes=[1], block_size=16)
    usage = Usage(prompt_tokens=200, cached_tokens=0, completion_tokens=1)
    for expected_wait, taught in ((2.0, 0), (0.0, 1)):
        c = Call(id="c", path="/v1/chat/completions")
        c.route = Route(backend="b", queued_tokens=5000, slot_wait=expected_wait)
        c.dispatched_at, c.first_byte_at = 10.0, 10.5
        time_rates(c, key, c.route, usage, rates)
        assert rates.observations == taught
    assert rates.reports == 2  # what it prefilled counts either way


def test_a_call_that_waited_for_a_slot_teaches_the_forecasts_error() -> None:
    rates = Rates()
    key = PrefixKey(tokens=200, hashes=[1], block_size=16)
    usage = Usage(prompt_tokens=200, cached_tokens=0, completion_tokens=1)
    for first_byte, error in ((10.5, 0.3), (11.0, (0.3 + 0.2) / 2)):
        c = Call(id="c", path="/v1/chat/completions")
        c.route = Route(backend="b", slot_wait=0.6, expected_ttft=0.8)
        c.dispatched_at, c.first_byte_at = 10.0, first_byte
        time_rates(c, key, c.route, usage, rates)
        assert rates.slot_error == pytest.approx(error)
    assert (rates.slot_waits, rates.observations) == (2, 0)
