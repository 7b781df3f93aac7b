"""Routing policy: which backend gets a call, from what the index knows and how loaded each is.

Functions of their inputs and a little memory (round robin's turn, cache-aware's last
placements), so every rule is a unit test away. The cache-aware rule, and why:

- A match is worth the share of THIS prompt it covers. Conversations that share only a
  system prompt all match whichever backend saw it first; treating such a weak match as a
  hit sends every conversation there (the collapse seen in naive longest-prefix routers).
  Below ``min_match_share`` a match counts as a miss.
- A strong match is valued at its share minus its queue cost: each request of load above
  the least loaded backend costs ``1 / load_slack`` of a prompt. The call goes to the
  match of highest value, and to none whose value is negative, so a full match keeps
  the call within ``load_slack`` requests of the least loaded and a weaker one within
  fewer. The guard is tight because the tail latency is won or lost there.
- Except for long matches on prefixes few calls share: a match is a prefill saved, and
  prefill grows with tokens, so one covering more than ``long_match_tokens`` is worth its
  share times tokens / long_match_tokens (a 1,000-token prompt stays within 16 requests
  instead of 8; shared-prefix benchmark: 1-2 of 4,480 calls otherwise left for a cold
  prefill). Not for a prefix carrying more than one backend's share of the recent calls
  (``Popularity``): an agent's 2,000-token system prompt that every conversation shares,
  valued by length, drew every new conversation to the one backend that saw it first. A
  popular prefix is better copied to every backend; a rare one kept where it is, out of
  the other caches.
- Misses go to the backend with the fewest requests queued; among equals, to the one that
  was given a new prompt longest ago, then by KV usage, then by a consistent (rendezvous)
  hash of the conversation's anchor; never "backend 0 first". Conversations that start
  together send their next turns together: on one backend their prefills queue behind
  each other. KV usage, scraped once a second, used to be the tie-break and named the
  same backend for a whole second (multi-turn benchmark: 20-42 of 138-184 conversations
  started next to their predecessor, TTFT p99 52 ms; with this rule none, 41 ms).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import BackendUnavailable
from gateway.flow import Decision, PrefixKey, Route
from gateway.settings import RoutingSettings


@dataclass(slots=True, frozen=True)
class Candidate:
    """A backend as routing sees it: the registry fills these from its counters and scrapes."""

    name: str
    healthy: bool
    in_flight: int
    """Calls this gateway has in flight there."""
    waiting: int = 0
    """vLLM's `vllm:num_requests_waiting`."""
    kv_usage: float = 0.0
    """vLLM's `vllm:kv_cache_usage_perc`, 0..1."""
    weight: float = 1.0

    @property
    def queued(self) -> float:
        """Requests per unit of weight, without the KV-usage term."""
        return (self.in_flight + self.waiting) / max(self.weight, 1e-9)

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


class CacheAware:
    def __init__(self, settings: RoutingSettings) -> None:
        self._s = settings
        self._placed = Placements()
        self._popular: dict[str, Popularity] = {}

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
        healthy = healthy_only(candidates)
        least = min(c.load for c in healthy)
        popular = self._popularity(model)
        popular.count(key)
        strong = {
            c.name: self._worth(popular, key, matches[c.name], tokens, len(healthy))
            for c in healthy
            if matches.get(c.name, 0) >= max(self._s.min_match_blocks, 1)
            and (tokens := covered(key, matches[c.name])) / max(key.tokens, 1)
            >= self._s.min_match_share
        }
        value = {
            c.name: strong[c.name] - self._queue_cost(c.load - least)
            for c in healthy
            if c.name in strong
        }
        eligible = [c for c in healthy if value.get(c.name, -1.0) >= 0]
        if eligible:
            most = max(value[c.name] for c in eligible)
            pick = rendezvous([c for c in eligible if value[c.name] == most], key.anchor)
            top = max(matches[name] for name in strong)
            return route(key, matches, pick, "hit" if matches[pick.name] == top else "overflow")
        if strong:
            return route(key, matches, self._placed.pick(healthy, key.anchor), "overflow")
        if session is not None and self._s.session_affinity:
            return self._pinned(key, matches, healthy, least, session_hash(session), "affinity")
        if not index_ok:
            return self._pinned(key, matches, healthy, least, key.anchor, "fallback")
        return route(key, matches, self._placed.pick(healthy, key.anchor), "miss")

    def _popularity(self, model: str) -> Popularity:
        popular = self._popular.get(model)
        if popular is None:
            popular = self._popular[model] = Popularity(
                self._s.long_match_tokens, self._s.popularity_window, time.monotonic
            )
        return popular

    def _worth(
        self, popular: Popularity, key: PrefixKey, blocks: int, tokens: int, backends: int
    ) -> float:
        """A match of ``tokens`` (``blocks``) in shares of the prompt, more for a long one
        few calls share (see the module docstring)."""
        share = tokens / max(key.tokens, 1)
        long = self._s.long_match_tokens
        if tokens <= long or popular.share(key, blocks) > 1 / backends:
            return share
        return share * tokens / long

    def _queue_cost(self, extra_load: float) -> float:
        """Requests queued beyond the least loaded backend, in shares of a prompt: a whole
        prompt served from cache is worth ``load_slack`` of them."""
        if self._s.load_slack > 0:
            return extra_load / self._s.load_slack
        return 0.0 if extra_load <= 0 else math.inf

    def _pinned(
        self,
        key: PrefixKey,
        matches: Mapping[str, int],
        healthy: list[Candidate],
        least: float,
        pin: int,
        decision: Decision,
    ) -> Route:
        """The consistent-hash choice for pin, unless it is loaded past the slack."""
        pick = rendezvous(healthy, pin)
        if pick.load - least > self._s.load_slack:
            return route(key, matches, least_loaded(healthy, pin), "miss")
        return route(key, matches, pick, decision)


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


def healthy_only(candidates: Sequence[Candidate]) -> list[Candidate]:
    healthy = [c for c in candidates if c.healthy]
    if not healthy:
        raise BackendUnavailable("no healthy backend for this model")
    return healthy


class Popularity:
    """The share of recent calls that begin like a given prompt, for one model.

    Counted at a few depths only (the chain hashes at 1, 2 and 4 times ``unit`` tokens),
    so a call costs three counter increments; a prefix is judged at the deepest of them it
    covers, which counts every call sharing at least that much (a little more than share
    the whole prefix). Two windows of ``window`` seconds, the current and the previous, so
    at most three entries per call of the last two windows. Each replica counts its own
    calls: a share, which replicas behind one balancer see alike.
    """

    def __init__(self, unit: int, window: float, clock: Callable[[], float]) -> None:
        self._unit, self._window, self._clock = unit, window, clock
        self._now: Counter[int] = Counter()
        self._before: Counter[int] = Counter()
        self._calls = [0, 0]
        self._turn_at = clock() + window
        self._by_block: dict[int, tuple[int, ...]] = {}

    def count(self, key: PrefixKey) -> None:
        if self._clock() >= self._turn_at:
            self._turn()
        self._calls[0] += 1
        for depth in self._depths(key.block_size):
            if depth > len(key.hashes):
                break
            self._now[key.hashes[depth - 1]] += 1

    def share(self, key: PrefixKey, blocks: int) -> float:
        """Of the recent calls, the share that begins with this prompt's first ``blocks``
        blocks (at the deepest counted depth within them; 0 below the first)."""
        h = None
        for depth in self._depths(key.block_size):
            if depth > blocks or depth > len(key.hashes):
                break
            h = key.hashes[depth - 1]
        if h is None:
            return 0.0
        return (self._now[h] + self._before[h]) / max(self._calls[0] + self._calls[1], 1)

    def _depths(self, block_size: int) -> tuple[int, ...]:
        depths = self._by_block.get(block_size)
        if depths is None:
            first = max(self._unit // block_size, 1)
            depths = self._by_block[block_size] = (first, 2 * first, 4 * first)
        return depths

    def _turn(self) -> None:
        now = self._clock()
        if now >= self._turn_at + self._window:  # idle for a whole window: all of it is old
            self._before, self._calls = Counter(), [0, 0]
        else:
            self._before, self._calls = self._now, [0, self._calls[0]]
        self._now = Counter()
        self._turn_at = now + self._window


class Placements:
    """Where a prompt no backend holds goes: the fewest requests queued, and among those
    the backend given a new prompt longest ago (see the module docstring)."""

    def __init__(self) -> None:
        self._seq = 0
        self._last: dict[str, int] = {}

    def pick(self, candidates: Sequence[Candidate], tiebreak: int) -> Candidate:
        fewest = min(c.queued for c in candidates)
        tied = [c for c in candidates if c.queued == fewest]
        oldest = min(self._last.get(c.name, 0) for c in tied)
        pick = least_loaded([c for c in tied if self._last.get(c.name, 0) == oldest], tiebreak)
        self._seq += 1
        self._last[pick.name] = self._seq
        return pick


def least_loaded(candidates: Sequence[Candidate], tiebreak: int) -> Candidate:
    least = min(c.load for c in candidates)
    return rendezvous([c for c in candidates if c.load == least], tiebreak)


def rendezvous(candidates: Sequence[Candidate], key: int) -> Candidate:
    """Weighted rendezvous hashing: stable when backends come and go, spread by weight."""

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
    )
