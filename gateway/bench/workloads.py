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

import itertools
import random
from collections.abc import Callable, Iterator
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


Span = tuple[int, int]
"""An inclusive range a length is drawn from, uniformly."""


def text(rng: random.Random, words: int, end: str = ".") -> str:
    """A sentence of exactly ``words`` words from the fixed vocabulary (~1 token each)."""
    picked = rng.choices(WORDS, k=max(words, 1))
    return " ".join([picked[0].capitalize(), *picked[1:]]) + end


def zipf(n: int, s: float = 1.0) -> list[float]:
    """Popularity weights of n items, the k-th in proportion to 1 / k^s: a few hot ones."""
    return [1 / (k + 1) ** s for k in range(n)]


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


@dataclass(slots=True)
class _Conversation:
    """A conversation in progress in a pool (see ``_pool``)."""

    id: str
    system: str
    turns: int
    message_words: Span
    max_tokens: Span
    index: int = 0


def _pool(rng: random.Random, live: int, new: Callable[[int], _Conversation]) -> Iterator[Turn]:
    """Turns of ``live`` conversations in progress, each next turn from one picked at random.

    A conversation that ends is replaced by a new one (``new(n)``, n counting from 0), so
    the pool stays full: users who come and go, each waiting for an answer before the
    next message (the runner holds a turn until its predecessor is answered).
    """
    started = itertools.count()
    slots = [new(next(started)) for _ in range(live)]
    while True:
        slot = rng.randrange(live)
        c = slots[slot]
        last = c.index == c.turns - 1
        message = text(rng, rng.randint(*c.message_words))
        yield Turn(c.id, c.index, c.system, message, rng.randint(*c.max_tokens), last)
        c.index += 1
        if last:
            slots[slot] = new(next(started))


@dataclass(frozen=True, slots=True)
class Agents:
    """An agent or app: every conversation under ONE long system prompt.

    Once every backend holds the system prompt, a router that values a match by its share
    of the prompt sees a strong match everywhere; what tells backends apart is each
    conversation's own history, a fraction of the prompt. The system prompt's length is
    drawn once per seed (a word of this vocabulary is one cl100k token); messages vary
    from a short question to a long tool result, answers from a word to a paragraph.
    """

    system_words: Span = (500, 4000)
    live: int = 48
    """Conversations in progress at once."""
    turns_per_conversation: Span = (2, 8)
    message_words: Span = (16, 160)
    max_tokens: Span = (16, 96)
    name: str = field(default="agents", init=False)

    def default_requests(self) -> int:
        return self.live * sum(self.turns_per_conversation) // 2

    def turns(self, seed: int) -> Iterator[Turn]:
        rng = random.Random(f"{seed}:{self.name}")
        system = text(rng, rng.randint(*self.system_words))

        def new(n: int) -> _Conversation:
            turns = rng.randint(*self.turns_per_conversation)
            return _Conversation(f"ag-c{n}", system, turns, self.message_words, self.max_tokens)

        return _pool(rng, self.live, new)


@dataclass(frozen=True, slots=True)
class Documents:
    """RAG: a few long documents, each asked many different questions.

    Each call is one question on one document (the system message: a shared instruction,
    then the document); documents are picked by Zipf popularity, so the hottest draws more
    calls than one backend's share and must be copied to stay balanced, while together they
    outgrow one backend's cache.
    """

    documents: int = 6
    document_words: Span = (1500, 3500)
    instruction_words: int = 64
    question_words: Span = (8, 64)
    max_tokens: Span = (16, 128)
    name: str = field(default="documents", init=False)

    def default_requests(self) -> int:
        return self.documents * 64

    def turns(self, seed: int) -> Iterator[Turn]:
        rng = random.Random(f"{seed}:{self.name}")
        instruction = text(rng, self.instruction_words)
        docs = [
            f"{instruction}\n\n{text(rng, rng.randint(*self.document_words))}"
            for _ in range(self.documents)
        ]
        weights = zipf(self.documents)
        asked = [0] * self.documents
        while True:
            (d,) = rng.choices(range(self.documents), weights)
            question = text(rng, rng.randint(*self.question_words), "?")
            yield Turn(f"doc-d{d}-q{asked[d]}", 0, docs[d], question, rng.randint(*self.max_tokens))
            asked[d] += 1


@dataclass(frozen=True, slots=True)
class Tenants:
    """Many tenants on one cluster, each its own system prompt and shape of traffic.

    A tenant's system prompt, message lengths and answer lengths are drawn once from wide
    ranges (a terse classifier beside a long-winded assistant), its share of the traffic
    by Zipf popularity. Its conversations run from one question (``tn-t3-q9``) to a few
    turns (``tn-t3-c9``).
    """

    tenants: int = 24
    live: int = 64
    system_words: Span = (50, 2000)
    message_words: Span = (8, 400)
    max_tokens: Span = (4, 192)
    turns_per_conversation: Span = (1, 6)
    name: str = field(default="tenants", init=False)

    def default_requests(self) -> int:
        return self.live * sum(self.turns_per_conversation) // 2

    def turns(self, seed: int) -> Iterator[Turn]:
        rng = random.Random(f"{seed}:{self.name}")
        shapes = [self._shape(rng) for _ in range(self.tenants)]
        weights = zipf(self.tenants)

        def new(n: int) -> _Conversation:
            (t,) = rng.choices(range(self.tenants), weights)
            system, words, answers = shapes[t]
            turns = rng.randint(*self.turns_per_conversation)
            kind = "q" if turns == 1 else "c"
            return _Conversation(f"tn-t{t}-{kind}{n}", system, turns, words, answers)

        return _pool(rng, self.live, new)

    def _shape(self, rng: random.Random) -> tuple[str, Span, Span]:
        """A tenant's system prompt and its own ranges of message and answer lengths."""
        system = text(rng, rng.randint(*self.system_words))
        return system, _subrange(rng, self.message_words), _subrange(rng, self.max_tokens)


def _subrange(rng: random.Random, span: Span) -> Span:
    low, high = sorted(rng.randint(*span) for _ in range(2))
    return low, high
