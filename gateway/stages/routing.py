"""Routing policy: which backend gets a call, from what the index knows and how loaded each is.

Functions of their inputs and a little memory (round robin's turn, the cost model's
placements and stream statistics), so every rule is a unit test away. The cache-aware
policy places each call where it costs least (:func:`gateway.stages.costs.cost`): its
own time to first token there (the wait for a sequence slot, then the prefill queued
ahead plus the tokens that backend does not hold, at that backend's learned rates) and
the delay its prefill adds to the calls behind it and the answers running there; and,
for a call that starts a conversation, what its later calls will meet there: queueing,
and a cache that may turn over before they come. No thresholds: a held prefix keeps a
call exactly as long as the prefill it saves outweighs the queue, and a prefix every
conversation shares (an agent's system prompt) is copied to another backend as soon as
the first one's load costs new conversations more than one prefill there.
That prefill is weighed against more than the call that pays it: the calls that share
the prefix next could use the copy too, and once the holders are the more loaded over
time (not at this moment), what a copy saves them outweighs one prefill
(:func:`gateway.stages.costs.relief`).

The later terms weigh where a conversation starts, not each of its turns: they rest on
utilization and cache turnover measured now but lived in over the conversation's life,
and re-deciding on every turn's reading would move conversations on noise, each move a
prefill of the history and a dead copy of it left behind. For the same reason
the later calls' service on each backend counts only as far as the fits can tell the
backends apart (:func:`services`): the later calls multiply whatever the fits miss by.

- Costs within the error of the cheapest's estimate (:func:`error`: an idle cluster,
  nothing held, the same prefix held everywhere, or a later turn's saving within what
  one call's forecast misses by) are ties: they go to the backend holding the
  most of the prompt, which leaves the least to prefill (a later turn whose costs tie
  stays with its history: moving it would prefill the history again and leave a dead
  copy behind, for a saving the estimates cannot show); a call that starts a stream,
  among those, to the backend fewest live streams call home (their later calls are load
  to come, which no estimate of the moment shows); then to the backend given a
  placement longest ago, then by a consistent (rendezvous) hash of the
  conversation's anchor; never "backend 0 first", and never to whichever backend's
  estimate noise made look a millisecond faster: conversations that start together send
  their next turns together, and pile up where they were all sent.
- A session key (``x-session-id``, ``prompt_cache_key``, ``user``) pins the call to its
  rendezvous backend, the same on every replica, when that backend holds as much of the
  prompt as any and costs no more than one prefill of the prompt above the cheapest:
  that prefill is what keeping the session together saves its next call. While the index
  is degraded, the conversation's anchor pins it the same way.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from gateway.errors import BackendUnavailable
from gateway.flow import Decision, PrefixKey, Route
from gateway.settings import RoutingSettings
from gateway.stages.costs import Load, Rates, Sharing, Streams, cost, relief


@dataclass(slots=True)
class Candidate:
    """A backend as routing sees it: the registry fills these from its counters and scrapes
    (one per backend per decision, never changed after: not frozen only because a frozen
    dataclass's constructor costs twice as much)."""

    name: str
    healthy: bool
    in_flight: int
    """Calls this gateway has in flight there."""
    waiting: int = 0
    """vLLM's `vllm:num_requests_waiting`."""
    kv_usage: float = 0.0
    """vLLM's `vllm:kv_cache_usage_perc`, 0..1."""
    weight: float = 1.0
    rates: Rates = field(default_factory=Rates)
    """The backend's learned TTFT coefficients (the cost model's)."""
    ahead: Load = field(default_factory=Load)
    """What a call routed now finds there (the cost model's)."""

    @property
    def load(self) -> float:
        """Requests per unit of weight; KV usage adds at most one request's worth, so it
        separates backends with equal queues without outweighing a real request."""
        return (self.in_flight + self.waiting + self.kv_usage) / max(self.weight, 1e-9)


class Policy(Protocol):
    def choose(
        self,
        model: str,
        key: PrefixKey,
        matches: Mapping[str, int],
        candidates: Sequence[Candidate],
        *,
        index_ok: bool = True,
        session: str | None = None,
    ) -> Route:
        """Pick a healthy backend; raise BackendUnavailable when there is none.

        ``matches`` is the index's answer (backend name -> leading blocks it holds);
        ``index_ok`` is False when that answer comes from a degraded index.
        """
        ...


def make_policy(settings: RoutingSettings) -> Policy:
    if settings.policy == "round_robin":
        return RoundRobin()
    if settings.policy == "least_loaded":
        return LeastLoaded()
    return CacheAware(settings)


TIE_ERRORS = 2 * math.sqrt(2)
"""Costs closer than two standard errors of the difference of two TTFT estimates cannot be
told apart: they are ties, which take turns (``Placements``) instead of following noise."""


class CacheAware:
    def __init__(
        self, settings: RoutingSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._s = settings
        self._placed = Placements()
        self._streams = Streams(clock)
        self._sharing = Sharing()

    def choose(
        self,
        model: str,
        key: PrefixKey,
        matches: Mapping[str, int],
        candidates: Sequence[Candidate],
        *,
        index_ok: bool = True,
        session: str | None = None,
    ) -> Route:
        healthy = timed(healthy_only(candidates))
        streams = self._streams
        held = sorted((matches.get(c.name, 0) for c in healthy), reverse=True)
        opening = key.tokens if key.opening is None else key.opening
        # Its history is held somewhere: it continues a conversation, even one whose
        # stream outlived the memory of streams (a gap of over three means, 1 in 20).
        continues = covered(key, held[0]) > opening
        home = streams.count(key.anchor, continues)
        starts = home is None and not continues
        later = streams.later_calls if starts else 0.0
        # What no other stream shares: beyond the prefix a second backend holds too.
        own = key.tokens - covered(key, held[1] if len(held) > 1 else 0)
        if len(healthy) == 1:  # nothing to weigh; the streams are counted all the same
            (pick,) = healthy
            if starts:
                self._sharing.count(self._shared(key, held[0]))
            pin = self._pin(key, session, index_ok)
            decision = pin[1] if pin else placement(held[0], held[0])
            self._placed.pick(healthy, key.anchor)
            streams.place(key.anchor, pick.name, own + pick.rates.uncached_per_call)
            return self._route(key, matches, pick, decision)
        # What it will want cached there at its next call: this prompt and the next turn.
        footprint = {c.name: own + c.rates.uncached_per_call for c in healthy}
        service = services(healthy) if starts else {}
        costs = {
            c.name: cost(
                c.rates,
                c.ahead,
                key.tokens - covered(key, matches.get(c.name, 0)),
                later,
                footprint[c.name],
                streams.footprint(c.name),
                service.get(c.name),
            )
            for c in healthy
        }
        if starts:
            self._share_out(key, held[0], matches, healthy, costs)
        pick, decision = self._pick(key, matches, healthy, costs, session, index_ok, starts)
        streams.place(key.anchor, pick.name, footprint[pick.name])
        return self._route(key, matches, pick, decision)

    def _share_out(
        self,
        key: PrefixKey,
        top: int,
        matches: Mapping[str, int],
        healthy: list[Candidate],
        costs: dict[str, float],
    ) -> None:
        """Count a start on ``top``, the longest prefix any backend holds (in blocks), and
        credit each backend without all of it with what a copy there saves the starts that
        share it next (:func:`gateway.stages.costs.relief`)."""
        sharers = self._sharing.count(self._shared(key, top))
        if not sharers:
            return
        holders = [(c.rates, c.ahead) for c in healthy if matches.get(c.name, 0) >= top]
        own = key.tokens - covered(key, top)
        for c in healthy:
            if matches.get(c.name, 0) < top:
                costs[c.name] -= relief(sharers, holders, c.rates, c.ahead, own)

    @staticmethod
    def _shared(key: PrefixKey, top: int) -> int | None:
        """The hash of the longest prefix of the prompt a backend holds (``top`` blocks)."""
        depth = min(top, len(key.hashes))
        return key.hashes[depth - 1] if depth else None

    def _pick(
        self,
        key: PrefixKey,
        matches: Mapping[str, int],
        healthy: list[Candidate],
        costs: Mapping[str, float],
        session: str | None,
        index_ok: bool,
        starts: bool,
    ) -> tuple[Candidate, Decision]:
        """The cheapest backend, unless a pin names one that costs no more than a prefill
        of the prompt above it (see the module docstring)."""
        top = max(matches.get(c.name, 0) for c in healthy)
        least = min(costs.values())
        pin = self._pin(key, session, index_ok)
        if pin is not None:
            pinned = rendezvous(healthy, pin[0])
            extra = costs[pinned.name] - least
            if matches.get(pinned.name, 0) == top and extra <= pinned.rates.ttft(key.tokens, 0):
                return pinned, pin[1]
        band = TIE_ERRORS * max(error(c, starts) for c in healthy)
        tied = [c for c in healthy if costs[c.name] <= least + band]
        most = max(matches.get(c.name, 0) for c in tied)
        tied = [c for c in tied if matches.get(c.name, 0) == most]
        if starts:
            fewest = min(self._streams.live(c.name) for c in tied)
            tied = [c for c in tied if self._streams.live(c.name) == fewest]
        pick = self._placed.pick(tied, key.anchor)
        return pick, placement(top, matches.get(pick.name, 0))

    def _pin(
        self, key: PrefixKey, session: str | None, index_ok: bool
    ) -> tuple[int, Decision] | None:
        if session is not None and self._s.session_affinity:
            return session_hash(session), "affinity"
        if not index_ok:
            return key.anchor, "fallback"
        return None

    @staticmethod
    def _route(
        key: PrefixKey, matches: Mapping[str, int], pick: Candidate, decision: Decision
    ) -> Route:
        chosen = route(key, matches, pick, decision)
        chosen.queued_tokens = pick.ahead.queued_tokens
        chosen.running = pick.ahead.running
        chosen.slot_wait = pick.ahead.slot_wait
        chosen.expected_ttft = chosen.slot_wait + pick.rates.ttft(
            pick.ahead.queued_tokens + chosen.uncached_tokens, pick.ahead.running
        )
        return chosen


class LeastLoaded:
    def choose(
        self,
        model: str,
        key: PrefixKey,
        matches: Mapping[str, int],
        candidates: Sequence[Candidate],
        *,
        index_ok: bool = True,
        session: str | None = None,
    ) -> Route:
        pick = least_loaded(healthy_only(candidates), key.anchor)
        return route(key, matches, pick, outcome(matches, pick))


class RoundRobin:
    """Each model's healthy backends in turn, by name; the only policy with state."""

    def __init__(self) -> None:
        self._turn: dict[str, int] = {}

    def choose(
        self,
        model: str,
        key: PrefixKey,
        matches: Mapping[str, int],
        candidates: Sequence[Candidate],
        *,
        index_ok: bool = True,
        session: str | None = None,
    ) -> Route:
        healthy = sorted(healthy_only(candidates), key=lambda c: c.name)
        turn = self._turn.get(model, 0)
        self._turn[model] = turn + 1
        pick = healthy[turn % len(healthy)]
        return route(key, matches, pick, outcome(matches, pick))


def error(c: Candidate, starts: bool) -> float:
    """The error of the call's estimated cost there.

    A start's cost is what a conversation will pay over its life there: its error is the
    learned rates' (the typical residual over the square root of the calls behind them).
    A later turn's is what this one call would save by leaving its history's backend, a
    forecast of the queue of the moment: it misses by as much as one call's TTFT misses
    its forecast (the typical residual itself), and by the slot-wait forecast's own error
    where it would wait for a slot. Leaving costs a sure prefill of the history and leaves
    a dead copy behind, for a saving within that error: noise that moves conversations,
    each move capacity the cluster no longer has for anyone."""
    if starts:
        return c.rates.error
    return c.rates.residual + (c.rates.slot_error if c.ahead.slot_wait else 0.0)


def services(candidates: Sequence[Candidate]) -> dict[str, float]:
    """A typical call's TTFT on each backend idle, as a start's later calls are costed at:
    the fastest backend's, and each other's only beyond the error of telling the two
    apart (:meth:`gateway.stages.costs.Rates.error_at`).

    A start's cost counts its later calls' service as many times as they follow, and
    with it whatever the fits miss by there: alike backends' fits differ at a typical
    call with nothing running (where backends always busy have no calls to fit) by a few
    milliseconds of noise, which fifteen later calls make larger than any tie band of
    one call's, and every conversation starting meanwhile went to one backend. What the
    fits can tell apart still counts, as many times over: a slower backend's service."""
    typical = {c.name: c.rates.ttft(c.rates.uncached_per_call, 0) for c in candidates}
    noise = {c.name: c.rates.error_at(c.rates.uncached_per_call, 0) for c in candidates}
    fastest = min(typical, key=typical.__getitem__)
    least = typical[fastest]
    return {
        name: least + max(t - least - TIE_ERRORS * math.hypot(noise[name], noise[fastest]), 0.0)
        for name, t in typical.items()
    }


def healthy_only(candidates: Sequence[Candidate]) -> list[Candidate]:
    healthy = [c for c in candidates if c.healthy]
    if not healthy:
        raise BackendUnavailable("no healthy backend for this model")
    return healthy


def timed(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates, those not yet timed at the rates of the most timed one.

    The prior is a guess at hardware nobody measured; the other backends serve the same
    model in the same cluster. Costed at the prior, an untimed backend looks cheaper or
    dearer than the timed ones by the prior's error alone, and draws (or shuns) calls
    whose histories are held elsewhere, until its own first answers come back."""
    most = max(candidates, key=lambda c: c.rates.observations)
    if not most.rates.observations:
        return candidates
    return [c if c.rates.observations else replace(c, rates=most.rates) for c in candidates]


class Placements:
    """Among backends that cost the same, the one given a placement longest ago (see the
    module docstring), then the rendezvous hash of the anchor."""

    def __init__(self) -> None:
        self._seq = 0
        self._last: dict[str, int] = {}

    def pick(self, candidates: Sequence[Candidate], tiebreak: int) -> Candidate:
        oldest = min(self._last.get(c.name, 0) for c in candidates)
        pick = rendezvous([c for c in candidates if self._last.get(c.name, 0) == oldest], tiebreak)
        self._seq += 1
        self._last[pick.name] = self._seq
        return pick


def least_loaded(candidates: Sequence[Candidate], tiebreak: int) -> Candidate:
    least = min(c.load for c in candidates)
    return rendezvous([c for c in candidates if c.load == least], tiebreak)


def rendezvous(candidates: Sequence[Candidate], key: int) -> Candidate:
    """Weighted rendezvous hashing: stable when backends come and go, spread by weight.
    One candidate is its own answer (the usual case once costs and placements have
    narrowed the choice): no hash to compute."""
    if len(candidates) == 1:
        return candidates[0]

    def score(c: Candidate) -> float:
        h = hashlib.blake2b(f"{key}:{c.name}".encode(), digest_size=8).digest()
        u = (int.from_bytes(h, "little") + 1) / (2**64 + 1)
        return -c.weight / math.log(u)

    return max(candidates, key=score)


def session_hash(session: str) -> int:
    return int.from_bytes(hashlib.blake2b(session.encode(), digest_size=8).digest(), "little")


def covered(key: PrefixKey, blocks: int) -> int:
    """Gateway tokens that ``blocks`` leading blocks of this prompt cover."""
    return min(blocks * key.block_size, key.tokens)


def placement(top: int, held: int) -> Decision:
    """The cost model's placement of a call whose longest held prefix is ``top`` blocks, on
    a backend holding ``held`` of them: nothing held anywhere, the longest, or less."""
    return "miss" if top == 0 else "hit" if held == top else "overflow"


def outcome(matches: Mapping[str, int], pick: Candidate) -> Decision:
    """For the policies that ignore the index: whether they happened to pick the best match."""
    held = matches.get(pick.name, 0)
    return "hit" if held > 0 and held == max(matches.values()) else "miss"


def route(key: PrefixKey, matches: Mapping[str, int], pick: Candidate, decision: Decision) -> Route:
    blocks = matches.get(pick.name, 0)
    return Route(
        backend=pick.name,
        decision=decision,
        predicted_cached_tokens=covered(key, blocks),
        matched_blocks=blocks,
        uncached_tokens=key.tokens - covered(key, blocks),
    )
