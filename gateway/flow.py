"""The typed record a call fills in, stage by stage.

Each stage reads what earlier stages set and fills its own fields; nobody keeps a
free-form dict. The field comments name what sets each one.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from gateway.limits.base import Plan

Endpoint = Literal["chat", "completions", "embeddings", "responses"]
ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
"""The proxied endpoints by path."""
Decision = Literal["hit", "miss", "overflow", "affinity", "fallback", "none"]
Period = Literal["day", "month"]


@dataclass(slots=True, frozen=True, eq=False)
class Principal:
    """Who is calling: set by stages.auth. Compared and hashed by identity: the key cache
    hands out one object per key until it reloads it, and the limits stage memoizes the
    plan per principal (hashing eleven fields, two of them Decimals, on every call cost
    more than building the plan did)."""

    key_id: str | None
    team: str | None
    models: frozenset[str] | None = None
    """Models the key may call; None means any."""
    rpm: int | None = None
    tpm: int | None = None
    budget_usd: Decimal | None = None
    team_rpm: int | None = None
    team_tpm: int | None = None
    team_budget_usd: Decimal | None = None
    budget_period: Period = "month"
    team_budget_period: Period = "month"

    @property
    def anonymous(self) -> bool:
        return self.key_id is None


ANONYMOUS = Principal(key_id=None, team=None)


@dataclass(slots=True)
class Request:
    """A parsed client request: set by stages.parse."""

    endpoint: Endpoint
    model: str
    body: dict[str, Any]
    """The decoded JSON body; forwarded upstream with the few edits the gateway makes."""
    stream: bool = False
    include_usage: bool = False
    """The client asked for the final usage chunk (stream_options.include_usage)."""
    max_tokens: int | None = None
    deterministic: bool = False
    """temperature 0 (or absent seed-free greedy): safe to coalesce identical calls."""
    session: str | None = None
    """x-session-id header, `prompt_cache_key` or `user` field: for session affinity."""
    end_user: str | None = None
    """`safety_identifier` or `user`: the app's end user, stored hashed on the ledger row."""


@dataclass(slots=True)
class PrefixKey:
    """The prompt as the index sees it: set by stages.prefix."""

    tokens: int
    """Prompt length in the gateway's tokenizer."""
    hashes: list[int]
    """Chained hashes of each full block; hashes[i] names the prefix of (i+1) blocks."""
    block_size: int
    anchor: int = 0
    """Hash of the conversation's opening (through the first non-system message), stable
    across turns: the consistent-hash key that spreads misses and keeps them sticky."""
    opening: int | None = None
    """Tokens of that opening; None: not known (taken as the whole prompt). A backend
    holding more of the prompt than its opening has seen this conversation before."""
    tail: bytes = b""
    """The prompt's tokens after its last full block (packed uint32, less than a block):
    what the reply's tokens continue when its key is hashed (stages.prefix's reply_key)."""


@dataclass(slots=True)
class Route:
    """Where the call goes and why: chosen by the policy (stages.routing), set by
    stages.dispatch (or copied from the call whose upstream request it shares)."""

    backend: str
    """Backend name."""
    decision: Decision = "none"
    predicted_cached_tokens: int = 0
    """Gateway-token count the index expects the backend to hold."""
    matched_blocks: int = 0
    uncached_tokens: int = 0
    """Prompt tokens the backend is expected to prefill (the prompt less the match)."""
    queued_tokens: float = 0.0
    """Prefill tokens the cost model saw queued ahead of the call there."""
    running: int = 0
    """Sequences the cost model saw running there."""
    expected_ttft: float = 0.0
    """Seconds to first byte the cost model expected there (0 for the other policies)."""
    slot_wait: float = 0.0
    """Of which the wait for a sequence slot there."""


@dataclass(slots=True)
class Usage:
    """Token counts as the backend reported them (stages.usage, stages.sse), or as the
    gateway counted them when none came (pipeline.finish)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cache_write_tokens: int = 0
    estimated: bool = False
    """True when counted by the gateway (no usage from the backend)."""


@dataclass(slots=True)
class Cost:
    """Money for the call, exact, in integer units of 1e-10 USD (the ledger's and the
    budgets' unit; ledger.models.to_usd gives USD): computed by stages.metering at the
    call's price version (Ledger.price), set by pipeline.finish."""

    input: int = 0
    cached_input: int = 0
    cache_write: int = 0
    output: int = 0
    total: int = 0
    without_cache: int = 0
    price_id: int | None = None


class Quota(NamedTuple):
    """What a limited call was charged to, and the headers its response carries: set by
    stages.limits. Shared: one per plan (and per verdict with the headers on), so a call
    allocates nothing here; its own reservation is Call.reserved_tokens."""

    headers: tuple[tuple[bytes, bytes], ...]
    """The x-ratelimit-* headers for the response, raw (shared by calls: never changed)."""
    plan: Plan
    """What the call was charged to: its settle goes to the same buckets and counters."""


class CallIds:
    """Unique call ids, 24 hex digits, without a system call each (``os.urandom`` per
    call cost a microsecond): 48 random bits name the process, drawn again in a forked
    child, and 48 bits count its calls."""

    def __init__(self) -> None:
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._prefix = os.urandom(6).hex()
        self._count = itertools.count()

    def new(self) -> str:
        return f"{self._prefix}{next(self._count):012x}"


new_call_id = CallIds().new


@dataclass(slots=True)
class Call:
    """One client call on its way through the gateway."""

    id: str
    """The gateway's own id for the call, unique: the ledger row's request_id, sent back as
    x-gateway-request-id (and as x-request-id when the client sent none)."""
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    received_at: float = field(default_factory=time.perf_counter)
    received_wall: float = field(default_factory=time.time)
    client_request_id: str | None = None  # stages.parse
    """The client's x-request-id, checked: echoed back and kept on the ledger row."""
    principal: Principal | None = None  # stages.auth
    request: Request | None = None  # stages.parse
    prefix: PrefixKey | None = None  # stages.prefix
    quota: Quota | None = None  # stages.limits
    reserved_tokens: int = 0  # stages.limits
    """Prompt estimate plus max_tokens; the difference to the actual usage is settled later."""
    route: Route | None = None  # stages.dispatch (batching, for a call sharing another's)
    dispatched_at: float | None = None  # stages.dispatch (batching, as for route)
    first_byte_at: float | None = None  # stages.relay: a stream's first token
    events: int | None = None  # backlog (0: to count), stages.relay
    """Events of a stream relayed so far (its opening, then about one per token): how far
    its answer has got, for when it will end and free its sequence slot. Counted only on
    a backend whose slots are known to run out (a scan of every byte relayed), as lines
    over two: vLLM writes each event as one line and a blank one, and counting newlines
    takes a third of the time counting blank lines does."""
    done_at: float | None = None  # stages.relay (a stream's), pipeline
    overhead: float | None = None  # pipeline (a whole answer's, as sent), else its end
    """Seconds spent in the gateway itself rather than waiting on the backend."""
    status: int = 200  # pipeline.failed, stages.relay (a stream that broke off), app
    error_type: str | None = None  # as status
    disconnected: bool = False  # stages.forward (ClientWatch), stages.relay
    """The client went away before the answer was complete."""
    served_by: Literal["upstream", "coalesced", "batched", "held"] = "upstream"  # batching
    usage: Usage | None = None  # pipeline: from stages.usage or stages.sse, or estimated
    cost: Cost | None = None  # pipeline.finish (the price step)
    reply: str = ""  # pipeline: from stages.usage or stages.sse
    """The answer's text (first choice): the next turn's prefix, for the index."""
    reply_share: float = 1.0  # as reply
    """The share of the answer ``reply`` holds: below 1 for a long stream read only to
    estimate its usage should none come (stages.sse, ``keep_text``)."""

    @property
    def model(self) -> str | None:
        return self.request.model if self.request else None

    @property
    def ttft(self) -> float | None:
        if self.first_byte_at is None:
            return None
        return self.first_byte_at - self.received_at

    @property
    def latency(self) -> float | None:
        if self.done_at is None:
            return None
        return self.done_at - self.received_at
