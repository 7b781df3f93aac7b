"""A backend's share of this gateway's work, counted for the routing cost model.

The engine's own gauges arrive once a second; calls arrive many times as often, and a
burst that lands between two scrapes would all see the same idle backend. So the gateway
counts what it has sent itself, exactly and at once: the prompt tokens each backend still
has to prefill for our calls (sent, no first byte yet), the KV cache our running calls
hold, and when each of them will end; the scrape adds other replicas'.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from gateway.flow import Call
from gateway.index.base import UNKNOWN_CAPACITY_TOKENS
from gateway.stages.costs import Load, Rates, blend, slot_wait


@dataclass(slots=True, eq=False)
class Backlog:
    rates: Rates = field(default_factory=Rates)
    capacity_tokens: int = 0
    """KV capacity: ``num_gpu_blocks x block_size`` from the engine; 0 until it says."""
    written_tokens: float = 0.0
    """Prompt tokens our calls have had the backend prefill into its cache."""
    busy: float = 0.0
    """Share of routing decisions that found prefill work of ours queued here: arrivals
    see time averages, so this is the share of time the backend is prefilling for us."""
    pending_at_scrape: int = 0
    """Our calls still awaiting their first byte when the last scrape answered."""
    engaged: float = 0.0
    """Sequences the engine has had (ours in flight, other replicas' running), up to the
    most seen running, as routing decisions find them (time-averaged, as ``busy``)."""
    peak: int = 0
    """The most sequences the engine was seen running at once."""
    slots: int = 0
    """The most sequences the engine runs at once (vLLM's ``max_num_seqs``, which it does
    not export): ``peak`` once calls were seen waiting while it ran that many on two
    scrapes in a row; 0 (not known) until then."""
    _asked_at: float = -math.inf
    """When a scrape was last asked for beyond ``peak`` (``ask_after``)."""
    _at_peak: bool = False
    """The last scrape found calls waiting while the engine ran ``peak`` sequences."""
    kv_tokens: float = 0.0
    """KV cache our calls there hold or will: their prompts and the answers they may write."""
    _calls: dict[str, Sent] = field(default_factory=dict)
    """Our calls in flight there (by id), in the order the engine got them."""
    _prefilling: dict[str, Sent] = field(default_factory=dict)
    """Those of them that may not be prefilled yet: every routing decision reads what is
    queued, and a busy engine has a few calls prefilling among hundreds decoding."""
    _sampled: int = 0
    """Routing decisions ``busy`` averages over (exactly for the first, see ``blend``)."""

    def scraped(self, capacity_tokens: int | None, running: int = 0, waiting: int = 0) -> None:
        """The engine answered a scrape: note its capacity, its sequence slots, and how
        many of our calls it had not answered yet (its waiting queue counts those).

        Calls wait at the slot limit, but also for the next scheduler step whatever the
        free slots: a step that prefills a long prompt takes a while, and one scrape
        taken during it finds calls waiting beside the few running. So the slot count is
        the most ever seen running, once two scrapes in a row found calls waiting at that
        many: a count learned low at a cold start would make the backend look full with
        slots free, and keep from it the calls that would show it runs more. Seen running
        more, the engine had more: unknown again until calls wait at the new peak. (A KV
        cache too full to admit more also makes calls wait, with fewer running.)"""
        if capacity_tokens:
            self.capacity_tokens = capacity_tokens
        if running > self.peak:
            self.peak, self.slots, self._at_peak = running, 0, False
        at_peak = running == self.peak and waiting > 0
        if at_peak and self._at_peak:
            self.slots = running
        self._at_peak = at_peak
        self.pending_at_scrape = len(self.pending(time.perf_counter()))

    def confirm_after(self, waiting: int) -> float | None:
        """Seconds after which a second scrape can tell whether the calls the last one
        found waiting at the peak wait for a slot; None when there is nothing to confirm.

        Waiting for the next scheduler step lasts no longer than the prefill queued ahead:
        calls still waiting once it is done wait for a slot. Confirmed at the next regular
        scrape instead, a burst that fills the slots for less than two scrape intervals
        would pass unseen, and the calls it queued be costed as if slots were free."""
        if not self._at_peak or self.slots == self.peak:
            return None
        return self.rates.ttft(self._ours(time.perf_counter()) + self._theirs(waiting), 0)

    def ask_after(self, interval: float) -> float | None:
        """Seconds after which a scrape can tell whether our newest call waits for a slot;
        None when no scrape is wanted. ``interval``: the regular scrapes'.

        A call sent while more of ours are in flight than the engine was ever seen running
        may find every slot taken, and the slot count stays unknown until scrapes find
        calls waiting at the peak. At the regular interval a wait shorter than it passes
        unseen, and a slow backend's full slots are costed as free for as long as no scrape
        happens to land in one (seconds, at a cold start). So a scrape is asked for once
        the prefill queued there is done, as ``confirm_after``'s is: at most one (and its
        confirming sequel) per interval, and only while the count is unknown, so the
        probing costs at most three times the scrapes, and nothing once the count is
        known."""
        if self.slots or len(self._calls) <= self.peak:
            return None
        now = time.perf_counter()
        if now < self._asked_at + interval:
            return None
        self._asked_at = now
        return self.rates.ttft(self._ours(now), 0)

    def slots_like(self, peers: int) -> int:
        """Its slot count, or while unknown ``peers``: the count learned on the other
        backends of its model (same model, same cluster: most likely the same engine
        settings), unless it has been seen running more. Unknown on one backend and known
        on another, the first looks free of slot waits the second shows, and draws calls
        (whole conversations' histories) that wait there just the same."""
        if self.slots:
            return self.slots
        return peers if peers >= self.peak else 0

    def occupied(self, slots: int) -> float:
        """Share of its ``slots`` the engine has had taken; 0 while the count is unknown.
        Averaged from the first decision on, not from when the count became known: it
        becomes known at a moment the engine is full, and an average begun then would
        start at 1 and push every call away until it forgot that moment."""
        return min(self.engaged / slots, 1.0) if slots else 0.0

    def admit(self, call: Call) -> None:
        """Count in a call just sent here (its route and dispatch time set): what routing
        will read of it on every decision, worked out once.

        Its own KV blocks are what it prefills and answers (the prefix it found cached is
        shared with whoever else uses it); while it has no first byte it counts as
        prefilling: for ever if it streams (its first byte will show), else until the TTFT
        routing expected (an answer that comes whole has no first byte to see)."""
        route, request = call.route, call.request
        assert route is not None
        assert call.dispatched_at is not None
        expected = call.dispatched_at + route.expected_ttft
        stream = request is not None and request.stream
        asked = request.max_tokens if request is not None else None
        uncached = route.uncached_tokens
        kv = uncached + answer_tokens(asked, self.rates.completion_per_call)
        sent = Sent(call, uncached, kv, expected, stream, asked)
        if self.slots:  # its end may be awaited: count its answer's progress
            call.events = 0
        self._calls[call.id] = sent
        self._prefilling[call.id] = sent
        self.kv_tokens += sent.kv
        self.written_tokens += sent.uncached

    def release(self, call: Call) -> None:
        self._prefilling.pop(call.id, None)
        sent = self._calls.pop(call.id, None)
        if sent is not None:
            self.kv_tokens -= sent.kv

    def pending(self, now: float) -> list[Sent]:
        """Our calls whose prompt is not prefilled yet: no first byte, and for an answer
        that comes whole (no first byte to see), not yet past the TTFT routing expected.
        Read on every routing decision: those found prefilled are forgotten (neither a
        first byte nor the passing of time is undone)."""
        prefilling = self._prefilling
        done = [
            k for k, s in prefilling.items() if s.call.first_byte_at is not None or now >= s.until
        ]
        for k in done:
            prefilling.pop(k, None)
        return list(prefilling.values())

    def slot_wait(self, now: float, others: int, slots: int) -> tuple[float, float]:
        """Seconds until a call sent now gets one of ``slots``, and the pace (seconds per
        answer token) it was forecast at: ours end when their answers are out at the pace
        the engine decodes now; ``others`` (other replicas' sequences) are taken as halfway
        through a typical call. (0, 0) when one is free now or the count is unknown."""
        if not slots or others + len(self._calls) < slots:
            return 0.0, 0.0
        rates = self.rates
        calls = list(self._calls.values())
        pace = self._pace(calls, now)
        typical = rates.hold(rates.uncached_per_call, rates.completion_per_call, pace)
        admitted = max(slots - others, 0)
        running = [typical / 2] * min(others, slots)
        usual = rates.completion_per_call
        running += [s.left(now, pace, usual) for s in calls[:admitted]]
        waiting = [typical] * max(others - slots, 0)
        waiting += [
            rates.hold(s.uncached, answer_tokens(s.asked, usual), pace) for s in calls[admitted:]
        ]
        return slot_wait(running, waiting, slots), pace

    def _pace(self, calls: list[Sent], now: float) -> float:
        """Seconds per answer token the engine decodes at now: over our counted streams
        (the first ``PACE_STREAMS``, the longest running), the time since their first
        token over the tokens relayed since (a little high: the relay stamps no time per
        piece); the learned pace until one has any. All running sequences decode in the
        same steps, so when slots are awaited (the engine runs more than usual) all are
        slower than the learned pace."""
        spent = tokens = 0.0
        counted = 0
        for s in calls:
            call, events = s.call, s.call.events or 0
            if call.first_byte_at is not None and events > 2:  # its opening, 1st, more
                spent += now - call.first_byte_at
                tokens += events - 2
                counted += 1
                if counted == PACE_STREAMS:
                    break
        return spent / tokens if tokens else self.rates.per_output

    def load(self, waiting: int, running: int, kv_usage: float, peer_slots: int = 0) -> Load:
        """What a call routed now finds here; ``waiting``, ``running`` and ``kv_usage`` are
        the engine's from the last scrape (``running`` counts ours), ``peer_slots`` the
        slot count its model's other backends showed (:meth:`slots_like`)."""
        now = time.perf_counter()
        ours, theirs = self._ours(now), self._theirs(waiting)
        self.busy = blend(self.busy, ours > 0, self._sampled)
        capacity = self.capacity_tokens or UNKNOWN_CAPACITY_TOKENS
        free = max(min(capacity - self.kv_tokens, capacity * (1 - kv_usage)), 0.0)
        others = max(running - len(self._calls), 0)
        engaged = len(self._calls) + others
        self.engaged = blend(self.engaged, min(engaged, self.peak or engaged), self._sampled)
        self._sampled += 1
        slots = self.slots_like(peer_slots)
        wait, pace = self.slot_wait(now, others, slots)
        return Load(
            queued_tokens=ours + theirs,
            running=max(running, len(self._calls)),
            slot_wait=wait,
            slots=slots,
            pace=pace,
            utilization=max(self.busy, self.occupied(slots), 1 - free / capacity),
            free_tokens=free,
            full=min(self.written_tokens / capacity, 1.0),
        )

    def _ours(self, now: float) -> float:
        """Prompt tokens our calls there still have to have prefilled."""
        return sum(s.uncached for s in self.pending(now))

    def _theirs(self, waiting: int) -> float:
        """Prompt tokens other replicas' calls have waiting there: of the ``waiting`` the
        engine reported, those not ours, at a typical call's."""
        return max(waiting - self.pending_at_scrape, 0) * self.rates.uncached_per_call


PACE_STREAMS = 32
"""Streams the decode pace is averaged over, the longest running first: they decode in
the same steps, so more would measure the same pace at more cost per decision."""


@dataclass(slots=True, frozen=True)
class Sent:
    """One of our calls in flight at the backend, with what routing reads of it."""

    call: Call
    uncached: float
    """Prompt tokens the backend has to prefill for it."""
    kv: float
    """Its share of ``Backlog.kv_tokens``."""
    expected: float
    """When its first token was expected."""
    stream: bool
    asked: int | None
    """The most answer tokens it asked for, if it did."""

    @property
    def until(self) -> float:
        """While it has no first byte, until when it counts as prefilling (``Backlog.admit``)."""
        return math.inf if self.stream else self.expected

    def left(self, now: float, pace: float, usual: float) -> float:
        """Seconds until it ends: its answer's tokens still to come at ``pace``, after its
        first token (seen, or when expected). Read for every running call on every
        routing decision where slots are awaited: what could be worked out once is."""
        call, answer = self.call, answer_tokens(self.asked, usual)
        start = call.first_byte_at
        if start is None:
            start = max(self.expected, now) if self.stream else self.expected  # late: not begun
        elif call.events is not None and call.events > 1:  # a stream, its tokens counted
            return max(answer - (call.events - 1), 0) * pace
        return max(start + pace * answer - now, 0.0)


def answer_tokens(asked: int | None, usual: float) -> float:
    """Tokens a call's answer may take: what it asked for, else the ``usual``."""
    return usual if asked is None else asked
