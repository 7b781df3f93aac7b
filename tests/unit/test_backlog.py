import time

import pytest

from gateway.backlog import Backlog
from gateway.flow import Call, PrefixKey, Request, Route


def call(i: int, uncached: int, *, stream: bool = True, expected: float = 0.1) -> Call:
    c = Call(id=f"c{i}", path="/v1/chat/completions")
    c.request = Request(endpoint="chat", model="m", body={}, stream=stream, max_tokens=10)
    c.prefix = PrefixKey(tokens=uncached + 100, hashes=[], block_size=16)
    c.route = Route(backend="b", uncached_tokens=uncached, expected_ttft=expected)
    c.dispatched_at = c.received_at
    return c


def test_queued_tokens_are_our_calls_still_prefilling_plus_the_engines_other_waiting() -> None:
    backlog = Backlog(capacity_tokens=1000)
    first, second = call(1, 300), call(2, 50)
    backlog.admit(first)
    backlog.admit(second)
    assert backlog.load(waiting=0, running=0, kv_usage=0.0).queued_tokens == 350
    first.first_byte_at = first.dispatched_at  # its prompt is prefilled
    load = backlog.load(waiting=0, running=0, kv_usage=0.0)
    assert (load.queued_tokens, load.running) == (50, 2)
    # Two waiting at the engine, one of them ours: the other is another replica's call.
    backlog.scraped(None)
    other = backlog.load(waiting=2, running=3, kv_usage=0.0)
    assert other.queued_tokens == 50 + backlog.rates.uncached_per_call
    backlog.release(first)
    backlog.release(second)
    assert backlog.load(waiting=0, running=0, kv_usage=0.0).queued_tokens == 0


def test_a_whole_answer_counts_as_prefilling_until_its_expected_ttft() -> None:
    backlog = Backlog()
    backlog.admit(call(1, 300, stream=False, expected=3600.0))
    backlog.admit(call(2, 200, stream=False, expected=0.0))
    assert backlog.load(waiting=0, running=0, kv_usage=0.0).queued_tokens == 300


def test_capacity_comes_from_the_engine_and_running_calls_take_their_share() -> None:
    backlog = Backlog()
    backlog.scraped(1000)
    assert backlog.capacity_tokens == 1000
    first = call(1, 600)  # 600 prefilled + 10 asked: 610 of 1,000 its own
    first.first_byte_at = first.dispatched_at  # decoding: no prefill queued
    backlog.admit(first)
    load = backlog.load(waiting=0, running=1, kv_usage=0.2)
    assert load.free_tokens == pytest.approx(390)
    assert load.utilization == pytest.approx(0.61)
    assert backlog.load(waiting=0, running=1, kv_usage=0.8).free_tokens == pytest.approx(200)
    assert backlog.load(waiting=0, running=1, kv_usage=0.0).full == pytest.approx(0.6)
    backlog.admit(call(2, 600))
    assert backlog.load(waiting=0, running=2, kv_usage=0.0).full == 1.0
    backlog.scraped(None)  # an engine that stops saying keeps what it said
    assert backlog.capacity_tokens == 1000


def test_busy_is_the_share_of_decisions_that_found_our_prefill_queued_from_the_first() -> None:
    backlog = Backlog()
    backlog.admit(call(1, 300))
    assert backlog.load(waiting=0, running=1, kv_usage=0.0).utilization == 1.0
    backlog.release(call(1, 300))
    assert backlog.load(waiting=0, running=0, kv_usage=0.0).utilization == 0.5


def test_the_slot_count_is_the_peak_running_once_calls_waited_at_it_twice_in_a_row() -> None:
    backlog = Backlog()
    backlog.scraped(None, running=3, waiting=0)
    backlog.scraped(None, running=2, waiting=1)  # waiting for the next step, not a slot
    assert backlog.slots == 0
    backlog.scraped(None, running=3, waiting=2)  # one long prefill step can look like this
    assert backlog.slots == 0
    backlog.scraped(None, running=3, waiting=1)
    assert backlog.slots == 3
    backlog.scraped(None, running=5, waiting=0)  # it ran more: 3 was not the limit
    assert backlog.slots == 0
    backlog.scraped(None, running=5, waiting=1)
    backlog.scraped(None, running=4, waiting=1)  # not at the peak: the pair is broken
    backlog.scraped(None, running=5, waiting=1)
    assert backlog.slots == 0
    backlog.scraped(None, running=5, waiting=2)
    assert backlog.slots == 5


def test_calls_seen_waiting_at_the_peak_are_looked_at_again_once_the_queued_prefill_is_done() -> (
    None
):
    """Waiting for the next scheduler step ends once the prefill queued ahead is done: a
    second scrape then tells a slot limit apart, well before the next regular one."""
    backlog = Backlog()
    backlog.admit(call(1, 300))  # ours, not prefilled yet
    assert backlog.confirm_after(waiting=0) is None  # nothing seen waiting
    backlog.scraped(None, running=3, waiting=3)  # ours and two of other replicas'
    rates = backlog.rates
    expected = rates.ttft(300 + 2 * rates.uncached_per_call, 0)
    assert backlog.confirm_after(waiting=3) == pytest.approx(expected)
    backlog.scraped(None, running=3, waiting=1)
    assert backlog.slots == 3
    assert backlog.confirm_after(waiting=1) is None  # confirmed: nothing left to ask
    backlog.scraped(None, running=2, waiting=1)
    assert backlog.confirm_after(waiting=1) is None  # not at the peak: no evidence


def test_a_call_beyond_the_most_the_engine_was_seen_running_asks_for_a_scrape() -> None:
    """A wait for a slot shorter than the scrape interval would pass unseen: the look
    comes once the prefill queued there is done, at most once an interval, and never
    once the slot count is known."""
    backlog = Backlog()
    backlog.scraped(None, running=2, waiting=0)
    backlog.admit(call(1, 300))
    backlog.admit(call(2, 100))
    assert backlog.ask_after(interval=1.0) is None  # no more than it was seen running
    backlog.admit(call(3, 50))
    assert backlog.ask_after(interval=1.0) == pytest.approx(backlog.rates.ttft(450, 0))
    backlog.admit(call(4, 50))
    assert backlog.ask_after(interval=1.0) is None  # asked this interval already
    assert backlog.ask_after(interval=0.0) is not None
    backlog.scraped(None, running=2, waiting=2)
    backlog.scraped(None, running=2, waiting=2)
    assert backlog.slots == 2
    assert backlog.ask_after(interval=0.0) is None  # known: nothing to ask


def test_slots_unknown_are_taken_as_the_peers_unless_seen_running_more() -> None:
    """Unknown on one backend and known on its peer, the first would look free of the
    waits the second shows, and draw whole conversations that wait there just the same."""
    backlog = Backlog()
    backlog.rates.per_output = 0.1
    for i in (1, 2):
        c = call(i, 0)
        c.first_byte_at = c.dispatched_at
        backlog.admit(c)
    assert backlog.load(waiting=0, running=2, kv_usage=0.0).slot_wait == 0.0
    like = backlog.load(waiting=0, running=2, kv_usage=0.0, peer_slots=2)
    assert like.slot_wait == pytest.approx(1.0, abs=0.05)  # 10 tokens at 0.1 s each
    backlog.scraped(None, running=3, waiting=0)  # it ran three: it has more than two
    assert backlog.slots_like(2) == 0
    assert backlog.slots_like(4) == 4
    backlog.scraped(None, running=3, waiting=1)
    backlog.scraped(None, running=3, waiting=1)
    assert backlog.slots_like(8) == 3  # its own count, once learned, is what counts


def test_a_cold_start_scrape_during_a_long_prefill_does_not_cap_the_slots() -> None:
    """Two running and calls waiting behind one long prefill step, then the engine runs
    them all: the backend never looked full at two."""
    backlog = Backlog()
    backlog.scraped(None, running=2, waiting=6)
    assert backlog.slots == 0
    backlog.scraped(None, running=8, waiting=0)
    assert backlog.slots == 0
    assert backlog.peak == 8


def test_a_call_beyond_the_slots_waits_for_our_first_answer_to_end() -> None:
    backlog = Backlog()
    backlog.scraped(None, running=2, waiting=1)
    backlog.scraped(None, running=2, waiting=1)
    assert backlog.slots == 2
    backlog.rates.per_output = 0.1
    early, late = call(1, 0), call(2, 0)  # each asks for 10 tokens: 1 s of decoding
    for c in (early, late):
        c.first_byte_at = c.dispatched_at
        backlog.admit(c)
    assert early.first_byte_at is not None
    late.first_byte_at = early.first_byte_at + 0.5  # half a second further from its end
    wait = backlog.load(waiting=0, running=2, kv_usage=0.0).slot_wait
    now_after_early = time.perf_counter() - early.first_byte_at
    assert wait == pytest.approx(1.0 - now_after_early, abs=0.05)
    backlog.release(early)
    assert backlog.load(waiting=0, running=1, kv_usage=0.0).slot_wait == 0.0


def test_slow_answers_hold_their_slots_for_the_tokens_they_have_left_at_the_pace_seen() -> None:
    """A stream 2 s past its first token, at the learned 0.1 s a token, would be over; it
    has relayed 6 of its 10 tokens (after its opening): 0.4 s a token, 1.6 s to go. One
    just begun beside it decodes in the same steps: 9 tokens to go at 0.4 s."""
    backlog = Backlog()
    backlog.scraped(None, running=2, waiting=1)
    backlog.scraped(None, running=2, waiting=1)
    backlog.rates.per_output = 0.1
    slow, new = call(1, 0), call(2, 0)
    for c in (slow, new):
        backlog.admit(c)
    slow.first_byte_at = time.perf_counter() - 2.0
    slow.events = 1 + 6
    new.first_byte_at, new.events = time.perf_counter(), 1 + 1
    # At the learned pace the one begun would end first, in 0.9 s.
    full = backlog.load(waiting=0, running=2, kv_usage=0.0)
    assert full.slot_wait == pytest.approx(1.6, abs=0.05)
    assert full.pace == pytest.approx(0.4, abs=0.01)  # what the cost's slot hold is at
    slow.events = 1 + 10  # all its tokens out: it ends as soon as its last events do
    assert backlog.load(waiting=0, running=2, kv_usage=0.0).slot_wait == 0.0
    backlog.release(slow)
    assert backlog.load(waiting=0, running=1, kv_usage=0.0).pace == 0.0  # a slot is free


def test_other_replicas_sequences_take_slots_too() -> None:
    backlog = Backlog()
    backlog.scraped(None, running=2, waiting=1)
    backlog.scraped(None, running=2, waiting=1)
    backlog.rates.per_output = 0.1
    ours = call(1, 0)
    ours.first_byte_at = ours.dispatched_at
    backlog.admit(ours)
    assert backlog.load(waiting=0, running=1, kv_usage=0.0).slot_wait == 0.0  # one free
    # Another replica's sequence fills the second slot: taken as halfway through a call.
    assert backlog.load(waiting=0, running=2, kv_usage=0.0).slot_wait > 0.0


def test_slot_occupancy_is_averaged_from_the_first_decision_not_from_when_slots_are_known() -> None:
    """The slot count becomes known at a moment the engine is full; an average begun then
    would start at 1 and make the backend look saturated long after."""
    backlog = Backlog()
    decoding = call(1, 0)
    decoding.first_byte_at = decoding.dispatched_at
    backlog.admit(decoding)
    for _ in range(3):  # one sequence of ours; the slot count not known yet
        assert backlog.load(waiting=0, running=1, kv_usage=0.0).utilization == pytest.approx(
            0.0, abs=1e-3
        )
    backlog.scraped(None, running=4, waiting=1)  # full at two scrapes: four slots
    backlog.scraped(None, running=4, waiting=1)
    load = backlog.load(waiting=1, running=4, kv_usage=0.0)
    assert load.utilization == pytest.approx((1 + 1 + 1 + 4) / 4 / 4, abs=1e-3)
