"""Typed, frozen settings: one section per concern, built once and passed in.

Sources, lowest to highest precedence: defaults, the YAML file given with
``--config``, then ``GATEWAY_*`` environment variables (nested with ``__``, e.g.
``GATEWAY_REDIS__URL``). Nothing here is built at import time.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    max_body_bytes: int = 8 * 1024 * 1024
    """Requests with a larger body are refused with 413 before they are parsed."""
    log_level: str = "info"
    access_log: bool = True
    drain_timeout: float = Field(50.0, ge=0)
    """Seconds a SIGTERM (or SIGINT) waits for calls in flight to finish before cutting them
    off; then the ledger is flushed and the process exits 0. 50 s fits inside Kubernetes'
    terminationGracePeriodSeconds of 60 (deploy/k8s) with time left for the flush."""
    worker_healthcheck_timeout: int = Field(30, ge=1)
    """Seconds a worker of `--workers N` may take to answer its supervisor's ping before it
    is killed and started again. A worker answers from a thread, which waits its turn for
    the interpreter: a start that builds the tokenizer on a saturated machine can take
    longer than uvicorn's 5 s, and then every worker is killed before it serves."""
    gc_freeze: bool = True
    """Move everything alive once started (modules, settings, tokenizer tables) out of the
    garbage collector's sight: its full collections would walk them all, stalling calls
    under load, and they never become garbage anyway."""


class UpstreamSettings(Section):
    connect_timeout: float = 5.0
    first_byte_timeout: float = Field(60.0, gt=0)
    """Longest wait from sending a stream to its first event: the backend's queue plus the
    prompt's prefill. 60 s, not less: a long prompt on a busy GPU (a 100k-token document on
    a large model behind a full queue) legitimately takes tens of seconds. A stream over
    it is cut and retried on another backend."""
    idle_timeout: float = Field(30.0, gt=0)
    """Longest silence between two chunks of a stream once it has begun. A decoding
    engine sends a token every few tens of ms; 30 s leaves room for a preempted sequence
    to be recomputed. The stream then ends with an error event (its client has bytes)."""
    read_timeout: float = Field(600.0, gt=0)
    """Longest wait for a non-streamed answer, which vLLM sends only once it is whole:
    silence alone cannot tell a long generation from a hung backend, so this bound is
    generous and a hung backend is found by the circuit breaker instead, whose ejection
    moves the calls waiting on it to another backend at once."""
    retries: int = Field(1, ge=0)
    """Calls that have sent nothing to their client yet are retried on another backend this
    many times when theirs fails (refused, reset, silent past its timeout, 5xx)."""
    failure_threshold: int = Field(3, ge=1)
    """Consecutive failed calls (reset, timed out, 5xx) that eject a backend at once.
    A refused connection or a failed health probe ejects it at the first."""
    ejection_time: float = Field(5.0, ge=0)
    """Seconds a backend ejected for failed calls stays out; then a good health probe lets
    it back on probation, where its first failure ejects it again. One ejected by a probe
    is back at the next good probe."""
    max_connections: int = Field(1000, ge=1)
    """Connections open to each backend at most (kept alive between calls); a call beyond
    them waits for one to come back."""
    health_interval: float = 0.75
    health_timeout: float = 1.0
    """A probe unanswered this long ejects the backend: with the interval, a hung backend
    is taken out within 1.75 s. Keep it above the backends' worst /health latency under
    load (vLLM answers /health from its API server's event loop)."""
    metrics_interval: float = 1.0
    """How often each backend's /metrics is scraped for its queue and KV-cache load."""


class BackendSettings(Section):
    url: str
    """Base URL of an OpenAI-compatible server, without /v1 (e.g. http://10.0.0.5:8000)."""
    api_key: str | None = None
    weight: float = 1.0
    name: str | None = None
    """Stable name used in metrics and the ledger; defaults to host:port."""


class PriceSettings(Section):
    """USD per million tokens. Exact decimals: never floats."""

    input: Decimal = Decimal("0")
    cached_input: Decimal = Decimal("0")
    cache_write: Decimal = Decimal("0")
    output: Decimal = Decimal("0")


class ModelSettings(Section):
    name: str
    """The model name clients send."""
    backends: list[BackendSettings]
    upstream_model: str | None = None
    """The name the backends know the model by, if different."""
    encoding: str = "cl100k_base"
    """tiktoken encoding used to hash prompt prefixes."""
    price: PriceSettings = PriceSettings()


class PrefixSettings(Section):
    block_size: int = Field(16, ge=1)
    max_blocks: int = Field(2048, ge=1)
    """Prompts longer than block_size * max_blocks are hashed only up to that point."""
    token_cache_mb: float = Field(16.0, ge=0)
    """MiB of tokenized prompt pieces kept (LRU): multi-turn calls resend their history.
    The bound counts each piece's text and tokens; 16 MiB holds about 4,000 pieces of
    2,000 characters."""


class RoutingSettings(Section):
    policy: Literal["cache_aware", "least_loaded", "round_robin"] = "cache_aware"
    handle_ttl: float = 600.0
    """Seconds a prefill-state handle lives without being renewed by a hit."""
    session_affinity: bool = True
    """A session key (x-session-id, prompt_cache_key, user) pins its calls to one backend
    while that costs no more than a prefill of the prompt (see gateway.stages.routing)."""


class RedisSettings(Section):
    url: str | None = None
    """None: the in-process index and limits (the embedded default)."""
    key_prefix: str = "gw:"
    timeout: float = 0.05
    """Seconds a prefix-index lookup may take before routing goes on without it (the
    limiter's rounds have their own, longer deadline: limits.redis_timeout)."""
    cluster: bool = False
    """The URL names a node of a Redis Cluster."""
    probe_interval: float = 1.0
    """While Redis is failing, how often the index and the limiter probe it to recover."""
    queue_size: int = Field(10000, ge=1)
    """Index updates waiting for the background flusher; the oldest are dropped beyond it."""
    lease_period: float = Field(1.0, gt=0)
    """Seconds a replica may hold rate-limit units granted to it unused before they go back
    to the shared bucket (within half a period more), and the most its view of shared spend
    may age (limits/redis.py)."""
    settle_interval: float = Field(0.25, ge=0)
    """Seconds between sends of spend and token settles when no grant carries them. Each
    send is a Redis round that costs the gateway far more under load than alone, so a
    short interval is paid for in a busy gateway's CPU; the price of a long one is that
    other replicas see this one's spend up to that much later."""


class LimitsSettings(Section):
    """The shared (Redis) rate limits and budgets when Redis is slow or unreachable.

    A slow round is not an outage: most calls never wait on Redis (they spend leases, see
    limits/redis.py), so a round may take up to ``redis_timeout``, and one that times out
    is sent again; only ``outage_after`` timeouts in a row, or a real failure (connection
    refused or reset, an error reply), declare Redis unreachable. Then ``on_outage`` says
    what the limits do until a probe (every redis.probe_interval) finds Redis again, when
    shared enforcement resumes by itself:

    - ``local`` (the default): each replica enforces its share of every limit, the limit
      divided by the number of replicas it last saw registered in Redis (at least 1 a
      minute), starting from what the shared bucket held when it last heard from Redis;
      a budget, a share of what was left of it. Traffic goes on and the replicas together
      stay within the limits, so neither a tenant's calls nor the backends' capacity are
      at the mercy of an outage of the limits' store.
    - ``closed``: calls of keys that have limits or budgets are refused with 503 (calls of
      keys without any pass): nothing can be overspent, nobody limited is served.
    - ``open``: every call passes unlimited (availability over enforcement).

    gateway_limits_degraded{mode} is 1 while limits are not shared (alert:
    GatewayLimitsDegraded).
    """

    on_outage: Literal["local", "closed", "open"] = "local"
    redis_timeout: float = Field(1.0, gt=0)
    """Seconds one limiter round (grants and settles in one pipeline) may take. Calls
    rarely wait on a round, so a long deadline costs nothing while Redis answers, and a
    busy event loop is not taken for a dead Redis."""
    outage_after: int = Field(3, ge=1)
    """Rounds in a row that time out before Redis counts as unreachable."""


class DatabaseSettings(Section):
    url: str = "sqlite:///gateway.db"
    """SQLAlchemy URL; postgresql://... in production, a SQLite file by default."""
    auto_migrate: bool | None = None
    """Apply the migrations at start. None: only for SQLite; Postgres is migrated with
    `gateway migrate`, and a gateway finding an outdated schema refuses to start."""
    timeout: float = 5.0
    """Seconds to connect or run one statement before the ledger treats the database as down."""


class LedgerSettings(Section):
    enabled: bool = True
    batch_size: int = 1000
    flush_interval: float = 0.05
    spool_dir: Path = Path("gateway-spool")
    """Rows the database could not take wait here (append-only, fsync per batch)."""
    price_refresh_interval: float = 30.0
    """Seconds between reloads of the price table (so other replicas' admin changes arrive)
    and counts of the dead letters."""


class AuthSettings(Section):
    enabled: bool | None = None
    """None: on when a database other than the embedded SQLite file is configured."""
    admin_key: str | None = None
    pepper: str = ""
    """HMAC key for stored API-key hashes; changing it invalidates every issued key."""
    cache_ttl: float = 5.0
    """Seconds a key lookup (found or not) is trusted: how long a disabled key keeps working."""
    stale_for: float = Field(3600.0, ge=0)
    """While the key store (the database) fails, a key it confirmed within this many
    seconds keeps working from that record; keys it cannot vouch for get 503. An hour
    covers an outage someone is paged for and fixes; a key cannot be disabled while the
    store is down anyway, and expiry is still checked. Past it, the gateway stops trusting
    what it last read. 0: no key works once the store fails and its cache_ttl has passed."""
    cache_size: int = Field(100_000, ge=1)
    """Key lookups remembered (the longest loaded beyond it are forgotten)."""
    ratelimit_headers: bool = False
    """Also send the x-ratelimit-* headers on served calls, as OpenAI does. Refusals (429)
    always carry them with Retry-After, and that is what clients act on (the openai SDK
    reads nothing else); on every served call the six headers cost a tiny call a visible
    share of its gateway CPU, for clients that pace themselves from them (README,
    Performance).
    Off by default for that reason, as in Envoy's rate limit filter."""


class BatchingSettings(Section):
    """The batch stage (gateway.batching): calls that can share upstream work."""

    coalesce: bool = True
    """Identical deterministic calls (temperature 0, n = 1) in flight together share one
    upstream call."""
    cold_prefix_hold: bool = True
    """Calls sharing a long prefix that no backend holds wait for one leader's first token,
    then go to its backend."""
    hold_min_tokens: int = Field(256, ge=1)
    """Calls wait for a leader when they share at least this many leading tokens with it
    (gateway tokenizer)..."""
    hold_min_share: float = Field(0.5, ge=0.0, le=1.0)
    """...and that cover at least this share of the waiting call's own prompt (sharing only
    an opening is not worth the wait)."""
    hold_max_wait: float = Field(2.0, ge=0.0)
    """Seconds after a leader was sent that calls still wait for it; then they route as usual."""
    embeddings_window: float = Field(0.002, ge=0.0)
    """Longest wait, in seconds, for more embeddings calls to join a batch (only while a call
    of the same kind is upstream; an idle gateway sends at once). 0 turns micro-batching off."""
    embeddings_max_batch: int = Field(64, ge=1)
    """Most inputs in one batched embeddings request."""


class SimSettings(Section):
    """The built-in simulated backend started when no model is configured."""

    model: str = "sim-model"
    instances: int = 1
    port: int = 0
    """0: pick a free loopback port."""
    price: PriceSettings = PriceSettings(
        input=Decimal("3.00"), cached_input=Decimal("0.30"), output=Decimal("15.00")
    )
    """A demonstration price, so the embedded ledger shows what caching saves."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    models: list[ModelSettings] = []
    prefix: PrefixSettings = PrefixSettings()
    routing: RoutingSettings = RoutingSettings()
    redis: RedisSettings = RedisSettings()
    limits: LimitsSettings = LimitsSettings()
    database: DatabaseSettings = DatabaseSettings()
    ledger: LedgerSettings = LedgerSettings()
    auth: AuthSettings = AuthSettings()
    batching: BatchingSettings = BatchingSettings()
    sim: SimSettings = SimSettings()
    metrics_enabled: bool = True
    """Off: the request path records no metrics (ops gauges and the ledger's still do)."""
    metrics_multiproc_dir: Path | None = Field(None, validation_alias="PROMETHEUS_MULTIPROC_DIR")
    """Set (by `gateway serve --workers N`) when several worker processes share one port:
    prometheus_client writes every worker's values there and /metrics merges them."""

    @model_validator(mode="after")
    def _unique_models(self) -> Settings:
        names = [m.name for m in self.models]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"models configured twice: {sorted(dupes)}")
        return self

    @property
    def embedded(self) -> bool:
        """True when no backend is configured and the built-in simulator stands in."""
        return not self.models

    @property
    def auth_enabled(self) -> bool:
        if self.auth.enabled is not None:
            return self.auth.enabled
        return not self.database.url.startswith("sqlite")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(init_settings, InitSettingsSource)
        yaml_file = init_settings.init_kwargs.pop("_config_file", None)
        sources: list[PydanticBaseSettingsSource] = [env_settings, init_settings]
        if yaml_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build settings from defaults, an optional YAML file, the environment and overrides.

    Raises ``SettingsError`` with a readable message when the file or values are bad,
    so that `gateway serve` fails fast before it opens anything.
    """
    if config_file is not None and not Path(config_file).is_file():
        raise SettingsError(f"config file not found: {config_file}")
    try:
        # _config_file is no field: settings_customise_sources takes it off the init values.
        return Settings(_config_file=config_file, **overrides)  # type: ignore[call-arg]
    except ValueError as exc:
        raise SettingsError(f"invalid settings: {exc}") from exc


class SettingsError(Exception):
    """Bad configuration: reported to the operator at start, never to a client."""
