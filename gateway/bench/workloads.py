"""Seeded workloads: endless, reproducible streams of chat turns.

A workload is a frozen description (sizes and lengths); ``turns(seed)`` yields its
requests in dispatch order, the same sequence for the same seed in any process, built
from the fixed word list with ``random.Random`` so no data files are needed. Streams are
endless so a ``--duration`` run never runs dry; ``default_requests`` is the natural size
of one pass, used when the run is given no other bound.

Multi-turn conversations carry only the *user* side here: the runner appends each
assistant answer it actually received, as a chat app would, so turn i of a conversation
is sent only after turn i-1 completed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from gateway.bench.words import WORDS


@dataclass(frozen=True, slots=True)
class Turn:
    """One request: the next user message of one conversation."""

    conversation: str
    """Stable id; sent as x-session-id with ``--session-header``."""
    index: int
    """Position in the conversation: turn i > 0 waits for turn i-1 and resends its history."""
    system: str
    """The conversation's system prompt; empty means no system message."""
    user: str
    max_tokens: int
    last: bool = True
    """No later turn follows: the runner can forget this conversation once it is answered."""


class Workload(Protocol):
    @property
    def name(self) -> str: ...

    def default_requests(self) -> int: ...

    def turns(self, seed: int) -> Iterator[Turn]: ...


def text(rng: random.Random, words: int, end: str = ".") -> str:
    """A sentence of exactly ``words`` words from the fixed vocabulary (~1 token each)."""
    picked = rng.choices(WORDS, k=max(words, 1))
    return " ".join([picked[0].capitalize(), *picked[1:]]) + end


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """G groups, each a long system prompt, asked many short distinct questions.

    Questions from all groups are shuffled together, so consecutive requests rarely share
    a prefix: a router only gets cache hits by sending each group to the same backend.
    """

    groups: int = 8
    prefix_words: int = 1000
    questions: int = 16
    """Questions per group in one pass; later passes ask new questions."""
    question_words: int = 24
    max_tokens: int = 32
    name: str = field(default="shared-prefix", init=False)

    def default_requests(self) -> int:
        return self.groups * self.questions

    def turns(self, seed: int) -> Iterator[Turn]:
        rng = random.Random(f"{seed}:{self.name}")
        systems = [text(rng, self.prefix_words) for _ in range(self.groups)]
        asked = [0] * self.groups
        while True:
            order = [g for g in range(self.groups) for _ in range(self.questions)]
            rng.shuffle(order)
            for g in order:
                question = text(rng, self.question_words, "?")
                yield Turn(f"sp-g{g}-q{asked[g]}", 0, systems[g], question, self.max_tokens)
                asked[g] += 1


@dataclass(frozen=True, slots=True)
class MultiTurn:
    """Conversations that resend their whole history each turn, sharing a short system prompt.

    Conversations come in waves of ``conversations``; within a wave the order is
    turn-major (turn 0 of every conversation, then turn 1, ...), which puts the most
    distance between a turn and the one it waits for.
    """

    conversations: int = 16
    turns_per_conversation: int = 4
    system_words: int = 48
    message_words: int = 32
    max_tokens: int = 64
    name: str = field(default="multi-turn", init=False)

    def default_requests(self) -> int:
        return self.conversations * self.turns_per_conversation

    def turns(self, seed: int) -> Iterator[Turn]:
        rng = random.Random(f"{seed}:{self.name}")
        system = text(rng, self.system_words)
        wave = 0
        while True:
            for index in range(self.turns_per_conversation):
                for c in range(self.conversations):
                    message = text(rng, self.message_words)
                    last = index == self.turns_per_conversation - 1
                    conversation = f"mt-w{wave}-c{c}"
                    yield Turn(conversation, index, system, message, self.max_tokens, last)
            wave += 1


@dataclass(frozen=True, slots=True)
class Tiny:
    """Short prompt, short answer, no system prompt: measures per-request overhead."""

    requests: int = 200
    prompt_words: int = 8
    max_tokens: int = 4
    name: str = field(default="tiny", init=False)

    def default_requests(self) -> int:
        return self.requests

    def turns(self, seed: int) -> Iterator[Turn]:
        rng = random.Random(f"{seed}:{self.name}")
        n = 0
        while True:
            yield Turn(f"tiny-{n}", 0, "", text(rng, self.prompt_words), self.max_tokens)
            n += 1


@dataclass(frozen=True, slots=True)
class Mixed:
    """Shared-prefix and multi-turn traffic interleaved by a seeded coin.

    Each part keeps its own seeded stream and order, so the mix is reproducible and each
    part's requests are the ones it would send alone.
    """

    shared_prefix: SharedPrefix = SharedPrefix()
    multi_turn: MultiTurn = MultiTurn()
    name: str = field(default="mixed", init=False)

    def default_requests(self) -> int:
        return self.shared_prefix.default_requests() + self.multi_turn.default_requests()

    def turns(self, seed: int) -> Iterator[Turn]:
        rng = random.Random(f"{seed}:{self.name}")
        parts = (self.shared_prefix.turns(seed), self.multi_turn.turns(seed))
        weights = (self.shared_prefix.default_requests(), self.multi_turn.default_requests())
        while True:
            yield next(rng.choices(parts, weights)[0])
