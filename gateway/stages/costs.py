"""The routing cost model: how long a call would wait for its first token on each backend.

On a continuous-batching engine a call's time to first token is the wait for a sequence
slot (the engine runs at most so many at once; the rest wait until running ones finish
their answers), then a fixed cost (a scheduler step, the HTTP hop) plus the prefill work
in front of it and its own, plus a little for every sequence decoding beside it. So per
backend

    ttft = slot wait + overhead + per_token * (tokens queued ahead + tokens it lacks)
                                + per_running * sequences running

with the three coefficients and the time per generated token learned from what the
backend did (:class:`Rates`), so a slow backend, a GPU or a CPU need no setting; the slot
wait comes from when the sequences in front of the call will end (:func:`slot_wait`).
A placement also delays the calls that queue behind its prefill and the answers running
beside it, and a call that starts a conversation decides where the later ones go
(:class:`Streams` counts how many follow, how often, and how much cache the live ones
want on each backend); :func:`cost` adds both, in seconds.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

PRIOR_OVERHEAD = 0.02
"""Seconds: one scheduler step of a mid-sized model plus the hop, before any observation."""
PRIOR_PER_TOKEN = 1e-4
"""Seconds per prefilled token: 10,000 tokens/s, a mid-sized model on one GPU."""
PRIOR_PER_RUNNING = 5e-4
"""Seconds per running sequence: a decode token each in every step the call waits through."""
PRIOR_PER_OUTPUT = 0.02
"""Seconds per generated token of one sequence: a mid-sized model's decode step on one GPU."""
MEMORY = 200
"""Observations the estimates average over (their forgetting horizon): enough to average
out one noisy call, few enough to follow a backend that slows down within a minute."""
KEEP = 1.0 - 1.0 / MEMORY
"""What an exponential average over ``MEMORY`` observations keeps of itself at each one."""
TYPICAL_TOKENS, TYPICAL_RUNNING = 1000.0, 10.0
"""Scales at which the priors count as observations, so a backend whose calls all look
alike (all hits, say) keeps the prior's slope instead of an arbitrary one."""
PRIOR_WEIGHT = (1.0, 1.0, float(MEMORY))
"""Observations each prior counts as (overhead, per token, per running sequence). The
running count rises and falls with the tokens queued (busy backends have more of both),
so the fit cannot tell them apart well: that prior counts as a whole memory, and only a
consistent excess moves it."""
OUTLIER = 3.0
"""An observation further than this many typical residuals from the fit counts for less
(Huber), so one call stuck behind another replica's burst does not move the rates."""
BUSIEST = 0.95
"""The highest utilization the queueing term believes: above it, waits are unbounded."""


def blend(mean: float, value: float, seen: int) -> float:
    """The running mean after ``seen`` earlier values: exact for the first ``MEMORY``,
    then an exponential average over about that many."""
    weight = max(1.0 / (seen + 1), 1.0 / MEMORY)
    return mean + weight * (value - mean)


@dataclass(slots=True)
class Rates:
    """One backend's learned TTFT coefficients: weighted least squares with forgetting,
    shrunk towards the priors (each worth one observation at its typical scale).

    Also what the other terms need: what a call usually has to prefill there, and how long
    its answer usually is (the KV cache it will hold).
    """

    overhead: float = PRIOR_OVERHEAD
    per_token: float = PRIOR_PER_TOKEN
    per_running: float = PRIOR_PER_RUNNING
    uncached_per_call: float = TYPICAL_TOKENS
    completion_per_call: float = TYPICAL_TOKENS / 4
    hit_share: float = 0.0
    """Share of prompt tokens the backend's cache served: how often what it holds is reused."""
    per_output: float = PRIOR_PER_OUTPUT
    """Seconds between a sequence's generated tokens there (its decode step)."""
    decodes: int = 0
    slot_error: float = 0.0
    """Typical error, in seconds, of the TTFT predicted for a call expected to wait for a
    sequence slot: the slot-wait forecast's own (when running answers will end)."""
    slot_waits: int = 0
    reports: int = 0
    observations: int = 0
    _moments: tuple[float, ...] = (0.0,) * 9
    """The fit's decayed, weighted sums of 1, t, r, t*t, t*r, r*r, y, t*y and r*y over the
    observations (t tokens, r running sequences, y seconds)."""
    _scale: float = PRIOR_OVERHEAD
    _spread: tuple[float, ...] = (0.0,) * 6
    """The inverse of the fit's normal matrix (the priors' weight included), its upper
    triangle row by row: times the squared residual, the coefficients' covariance."""

    def ttft(self, tokens: float, running: float) -> float:
        return self.overhead + self.per_token * tokens + self.per_running * running

    def hold(self, uncached: float, completion: float, pace: float) -> float:
        """Seconds a call holds its sequence slot once admitted: its prefill, then its
        answer at ``pace`` seconds a token."""
        return self.overhead + self.per_token * uncached + pace * completion

    def waited(self, predicted: float, seconds: float) -> None:
        """A call expected to wait for a slot waited ``seconds`` for its first byte, where
        ``predicted`` said."""
        self.slot_error = blend(self.slot_error, abs(seconds - predicted), self.slot_waits)
        self.slot_waits += 1

    def decoded(self, seconds_per_token: float) -> None:
        """A streamed answer's time between its first and last token, per token."""
        self.per_output = blend(self.per_output, seconds_per_token, self.decodes)
        self.decodes += 1

    @property
    def residual(self) -> float:
        """Typical error of one call's predicted TTFT. None yet: the estimate is the prior
        every backend starts from, so no noise sets two backends apart."""
        return self._scale if self.observations else 0.0

    @property
    def error(self) -> float:
        """Standard error of the predicted mean TTFT where the fit's calls were: the typical
        residual over the square root of the observations behind it (at most ``MEMORY``)."""
        return self.residual / math.sqrt(max(min(self.observations, MEMORY), 1))

    def error_at(self, tokens: float, running: float) -> float:
        """Standard error of ``ttft(tokens, running)`` as an estimate of the mean: the
        typical residual, scaled by how well the calls behind the fit pin the line down
        there. Where those calls were, about the residual over the square root of a
        memory's worth of them; away from them (a call with nothing running beside it on a
        backend that is always busy, say) the errors of intercept and slopes add up, and
        alike backends' fits drift apart there by that much."""
        if not self.observations:
            return 0.0
        s00, s01, s02, s11, s12, s22 = self._spread
        q = (s00 + 2 * (s01 * tokens + s02 * running) + s11 * tokens * tokens
             + 2 * s12 * tokens * running + s22 * running * running)  # fmt: skip
        return self._scale * math.sqrt(max(q, 0.0))

    def observe(self, tokens: float, running: float, seconds: float) -> None:
        """A call that waited ``seconds`` for its first byte, with ``tokens`` of prefill
        ahead of and in it and ``running`` sequences beside it."""
        residual = abs(seconds - self.ttft(tokens, running))
        weight = min(1.0, OUTLIER * self._scale / residual) if residual > 0 else 1.0
        self._scale = KEEP * self._scale + (1 - KEEP) * max(residual, 1e-4)
        k, w, wt, wr = KEEP, weight, weight * tokens, weight * running
        n, t, r, tt, tr, rr, y, ty, ry = self._moments
        # fmt: off
        self._moments = (k * n + w, k * t + wt, k * r + wr,
                         k * tt + wt * tokens, k * tr + wt * running, k * rr + wr * running,
                         k * y + w * seconds, k * ty + wt * seconds, k * ry + wr * seconds)
        # fmt: on
        self.observations += 1
        self._fit()

    def served(self, cached_share: float, uncached_tokens: float, completion_tokens: int) -> None:
        """What the backend reported for a call: the share of the prompt its cache served,
        the prompt tokens it prefilled and how long the answer was."""
        seen = self.reports
        self.hit_share = blend(self.hit_share, cached_share, seen)
        self.uncached_per_call = blend(self.uncached_per_call, uncached_tokens, seen)
        self.completion_per_call = blend(self.completion_per_call, completion_tokens, seen)
        self.reports += 1

    def _fit(self) -> None:
        """Solve the normal equations, the priors added, in closed form (the inverse of a
        symmetric 3x3 matrix by its cofactors). Tokens and running sequences are counted
        in their typical scales while solving, which keeps the matrix' entries alike in
        size and the closed form exact to float precision; each prior then weighs its
        ``PRIOR_WEIGHT`` on the diagonal."""
        u1, u2 = TYPICAL_TOKENS, TYPICAL_RUNNING
        w0, w1, w2 = PRIOR_WEIGHT
        n, t, r, tt, tr, rr, y, ty, ry = self._moments
        a, b, c = n + w0, t / u1, r / u2
        d, e, f = tt / u1**2 + w1, tr / (u1 * u2), rr / u2**2 + w2
        c00, c01, c02 = d * f - e * e, c * e - b * f, b * e - c * d
        c11, c12, c22 = a * f - c * c, b * c - a * e, a * d - b * b
        det = a * c00 + b * c01 + c * c02
        if det <= 0:
            return
        y0 = y + w0 * PRIOR_OVERHEAD
        y1 = ty / u1 + w1 * u1 * PRIOR_PER_TOKEN
        y2 = ry / u2 + w2 * u2 * PRIOR_PER_RUNNING
        overhead = (c00 * y0 + c01 * y1 + c02 * y2) / det
        per_token = (c01 * y0 + c11 * y1 + c12 * y2) / (det * u1)
        per_running = (c02 * y0 + c12 * y1 + c22 * y2) / (det * u2)
        # fmt: off
        self._spread = (c00 / det, c01 / (det * u1), c02 / (det * u2),
                        c11 / (det * u1 * u1), c12 / (det * u1 * u2), c22 / (det * u2 * u2))
        # fmt: on
        self.overhead = max(overhead, 0.0)
        self.per_token = max(per_token, PRIOR_PER_TOKEN / 100)
        self.per_running = max(per_running, 0.0)


LIVE_GAPS = 3.0
"""A stream unseen for this many mean gaps between its calls has ended: an exponential
gap runs past three means one time in twenty."""


@dataclass(slots=True)
class Home:
    """Where a stream lives, and the cache it will want there."""

    backend: str
    footprint: float
    seen: float


class Streams:
    """Conversations: how many more calls follow a call, how long until the next, and how
    much of each backend's cache the live ones will want.

    A call whose anchor (its conversation's opening) was not seen recently starts a
    stream; the rest continue one. With ``f`` the share of calls that start one, a stream
    has ``1 / f`` calls, so ``1 / f - 1`` follow its first. A placement commits those
    later calls to the backend, so its sustained load and how much of the stream it can
    keep cached matter. Counted per replica: replicas behind one balancer see the same
    shares, each its own part of the streams.
    """

    def __init__(self, clock: Callable[[], float], remembered: int = 1 << 16) -> None:
        self._clock = clock
        self._homes: OrderedDict[int, Home] = OrderedDict()
        """Live streams by anchor, least recently seen first."""
        self._footprints: dict[str, float] = {}
        self._live: dict[str, int] = {}
        """Live streams per backend they call home."""
        self._remembered = remembered
        self._starts = 0.5
        """Share of calls that start a stream: before any evidence, as likely as not."""
        self.gap = 0.0
        """Mean seconds between a stream's consecutive calls."""
        self._gaps = 0

    @property
    def later_calls(self) -> float:
        return 1.0 / max(self._starts, 1.0 / MEMORY) - 1.0

    def count(self, anchor: int, continues: bool = False) -> Home | None:
        """Count a call; its stream's home, or None if it starts a stream or ``continues``
        one whose home was forgotten (the caller knows it from the index)."""
        now = self._clock()
        self._expire(now)
        home = self._homes.get(anchor)
        self._starts = KEEP * self._starts + (1 - KEEP) * (home is None and not continues)
        if home is not None:
            self.gap = blend(self.gap, now - home.seen, self._gaps)
            self._gaps += 1
        return home

    def footprint(self, backend: str) -> float:
        """Tokens the live streams homed on ``backend`` will want cached there."""
        return self._footprints.get(backend, 0.0)

    def live(self, backend: str) -> int:
        """Live streams homed on ``backend``."""
        return self._live.get(backend, 0)

    def place(self, anchor: int, backend: str, footprint: float) -> None:
        """The stream's call went to ``backend``; ``footprint``: what it will want there."""
        self._leave(anchor)
        self._homes[anchor] = Home(backend, footprint, self._clock())
        self._footprints[backend] = self.footprint(backend) + footprint
        self._live[backend] = self.live(backend) + 1
        if len(self._homes) > self._remembered:
            self._leave(next(iter(self._homes)))

    def _leave(self, anchor: int) -> None:
        home = self._homes.pop(anchor, None)
        if home is not None:
            self._footprints[home.backend] = max(self.footprint(home.backend) - home.footprint, 0)
            self._live[home.backend] -= 1

    def _expire(self, now: float) -> None:
        if self.gap <= 0:
            return
        while self._homes:
            anchor, home = next(iter(self._homes.items()))
            if now - home.seen < LIVE_GAPS * self.gap:
                return
            self._leave(anchor)


class Sharing:
    """How many recent starts shared each prefix held somewhere: the calls a copy of it on
    another backend would serve next.

    A call that starts a stream (or stands alone) on a prefix others have used recently
    is one of many: an agent's system prompt, a popular document. Whether a copy of that
    prefix elsewhere pays is a question about all of them, not about this call alone
    (:func:`relief`). The share of about the last ``MEMORY`` starts that shared it is
    taken as its share of as many to come, from the second start on: the count alone
    would take the few starts seen at first for all that come, and a prompt every
    conversation shares would be copied only once a crowd of them had piled onto its
    first holder. Counted per replica, as :class:`Streams`.
    """

    def __init__(self, remembered: int = 16 * MEMORY) -> None:
        self._counts: OrderedDict[int, tuple[float, int]] = OrderedDict()
        """Per prefix: its decayed count of starts, and the start it was last counted at,
        least recently counted first. A prefix no start shared in ``16 * MEMORY`` starts
        counts less than e^-16 of what it did: forgetting it changes no decision."""
        self._remembered = remembered
        self._starts = 0

    def count(self, prefix: int | None) -> float:
        """Count a start whose prompt's longest held prefix is ``prefix`` (None: nothing
        held); how many of the next ``MEMORY`` starts will share it: the decayed count of
        the starts that shared it before over the decayed count of all starts before, as
        many times as a memory holds."""
        self._starts += 1
        if prefix is None:
            return 0.0
        count, at = self._counts.pop(prefix, (0.0, self._starts))
        before = count * KEEP ** (self._starts - at)
        self._counts[prefix] = (before + 1.0, self._starts)
        if len(self._counts) > self._remembered:
            self._counts.popitem(last=False)
        starts_before = (1.0 - KEEP ** (self._starts - 1)) * MEMORY  # decayed, as ``before``
        return MEMORY * before / starts_before if starts_before else 0.0


def slot_wait(running: list[float], waiting: list[float], slots: int) -> float:
    """Seconds until a call queued now gets a sequence slot: the engine admits in arrival
    order as running sequences end. ``running``: seconds until each running sequence ends;
    ``waiting``: how long each call queued ahead will hold its slot; ``slots``: the most
    sequences the engine runs (0: unknown, no wait).

    Only the ``len(waiting) + 1`` earliest ends can matter: each admission takes the
    earliest end and puts back a later one, so after ``k`` of them one of the ``k + 1``
    earliest is still there, no later than any end beyond them."""
    if not slots or len(running) + len(waiting) < slots:
        return 0.0
    first = min(slots, len(waiting) + 1)
    free = min(max(slots - len(running), 0), first)
    ends = [0.0] * free + heapq.nsmallest(first - free, running)
    heapq.heapify(ends)
    for held in waiting:
        heapq.heappush(ends, heapq.heappop(ends) + held)
    return ends[0]


@dataclass(slots=True)
class Load:
    """What a backend has in front of a new call, as routing sees it when choosing (made
    per backend per decision and never changed: not frozen, as ``Candidate``)."""

    queued_tokens: float = 0.0
    """Prompt tokens dispatched there and not yet prefilled (ours, and an estimate of
    other replicas' from the engine's waiting queue)."""
    running: int = 0
    """Sequences in the engine: our calls in flight and other replicas'."""
    utilization: float = 0.0
    """Share of the time the backend has prefill work queued (as arrivals find it), of its
    sequence slots taken, or of its KV cache its running sequences hold: the highest."""
    free_tokens: float = float("inf")
    """KV cache not held by running sequences: what cached prefixes can live in."""
    full: float = 0.0
    """Share of its KV capacity the backend has had written so far, up to 1: once full,
    every token written evicts one."""
    slot_wait: float = 0.0
    """Seconds until a call sent now gets a sequence slot there (:func:`slot_wait`)."""
    slots: int = 0
    """The most sequences the engine runs at once; 0 while not known."""
    pace: float = 0.0
    """Seconds per answer token the engine decodes at now, as the slot wait was forecast
    at; 0 where no slot is awaited (the learned ``Rates.per_output`` then)."""


def evicted(free_tokens: float, wanted: float) -> float:
    """The share of what the live streams want cached that a cache of ``free_tokens``
    will have evicted by their next calls: ``exp(-free / wanted)``, Che's approximation of
    an LRU cache whose items are reused at the same rate. It grows smoothly with the
    crowding, so streams spread in proportion to what each cache can keep, instead of
    all going to whichever cache is not full yet until it is."""
    if wanted <= 0:
        return 0.0
    return math.exp(-free_tokens / wanted)


def cost(
    rates: Rates,
    load: Load,
    uncached: float,
    later_calls: float,
    footprint: float,
    wanted: float,
    service: float | None = None,
) -> float:
    """Seconds this placement costs: this call's TTFT there (the wait for a sequence slot
    included), the delay its prefill adds to the calls that queue behind it and to the
    sequences running there (the steps that prefill it decode them that much later, so
    each answer there ends, and frees its slot, that much later), and the prefill of what
    it evicts (once the cache is full each token written evicts one, reused as often as
    the backend's cache serves prompts: its cached share); then for each of
    ``later_calls`` its own time to first token there (a typical call's ``service`` on the
    backend idle, the fit's unless given, stretched by the queueing) and the prefill of
    its stream's ``footprint`` (what it will want cached) in the share the cache cannot
    keep, with the other live streams there wanting ``wanted``. The later calls' own TTFT
    is the same everywhere on alike backends; on a slower one it is what keeps
    conversations from starting there more than its speed warrants (a conversation that
    starts there and leaves for a faster one at its next turn prefills its history
    twice).

    A conversation that starts where it waits for a slot will hold one once admitted, for
    its prefill and its answer: the calls queued for a slot behind it wait that much
    longer, a ``1 / slots`` share of it each (the slots serve as one server that many
    times as fast), as many of them as the queueing at the backend's utilization says.
    Without it a full backend holding a popular prompt looked cheaper than a copy of the
    prompt elsewhere (a prefill there holds up the answers running beside it) for every
    new conversation on it. A later turn's slot is its conversation's, already part of
    the load its backend carries: weighed at its start, as the later calls are.

    The slot wait counts for every call, a conversation's later turns too: a turn whose
    backend is full for longer than its history takes to prefill elsewhere is served
    sooner elsewhere. What keeps such moves from costing more than they save is the
    prefill's toll on the sequences running where it lands: among backends all about as
    full, a history prefilled again holds up every answer beside it, and the move would
    only trade places in the queues.

    Queueing is M/M/1's: at utilization ``u`` a call with work of mean ``s`` ahead of it
    and its own takes ``s / (1 - u)``, and work added now delays ``u / (1 - u)`` calls
    behind it. The
    later terms are what spread conversations that all share one long system prompt, which
    the first alone would pile onto whichever backend is momentarily idlest, or onto the
    one that alone holds the prompt: there their histories would outgrow the cache.
    """
    crowd = crowding(load)
    prefill = rates.per_token * uncached
    evicts = load.full * rates.hit_share
    ahead = rates.ttft(load.queued_tokens, load.running) + load.slot_wait
    now = ahead + prefill * (1.0 + crowd + evicts + load.running)
    if later_calls <= 0:
        return now
    if load.slot_wait > 0 and load.slots:  # the calls queued behind it wait out its hold
        hold = rates.hold(uncached, rates.completion_per_call, load.pace or rates.per_output)
        now += crowd * hold / load.slots
    lost = evicted(load.free_tokens, wanted + footprint)
    if service is None:
        service = rates.ttft(rates.uncached_per_call, 0)
    typical = service * (1.0 + crowd)
    return now + later_calls * (typical + rates.per_token * footprint * lost)


def crowding(load: Load) -> float:
    """Calls a call's work delays behind it at the backend's utilization (M/M/1's
    ``u / (1 - u)``), believed up to ``BUSIEST``."""
    u = min(load.utilization, BUSIEST)
    return u / (1.0 - u)


def relief(
    sharers: float, holders: list[tuple[Rates, Load]], rates: Rates, load: Load, own: float
) -> float:
    """Seconds a copy of a shared prefix on this backend saves the calls that share it next.

    Without it, the ``sharers`` expected next (each, like this call, with ``own`` tokens
    beyond the prefix) all meet the load of the ``holders``; with it, one backend more
    shares them out, and its part of them meets this backend's load instead. As they
    come the two loads draw together, so each saves half the difference on average (none
    if the holders are the less loaded). It rests on utilization, which averages over
    many calls, not on the queue of the moment: a momentary queue clears before the next
    sharer comes, and a copy made for it would be a prefill for nothing. The difference
    is in queueing only, each sharer's service the same on both sides (this backend's):
    alike backends' fits differ by their noise (one's overhead a tenth of another's, the
    slope making up for it), and near saturation the queueing multiplies a difference of
    services twenty times over, which copied prefixes onto a saturated cluster for
    nothing; a slower backend's service is weighed where it serves, in :func:`cost`.
    This is Preble's replication of a prefix too hot for the backends that hold it, in
    the cost model's units: one prefill of the prefix here is worth it once the sharers'
    queueing it saves is more."""
    if sharers <= 0 or not holders:
        return 0.0
    theirs = sum(crowding(h) for _, h in holders) / len(holders)
    gap = rates.ttft(own, 0) * max(theirs - crowding(load), 0.0)
    return sharers / (len(holders) + 1) * gap / 2
