"""The simulator's options: one frozen record, shared by the CLI and the embedded starter."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """Every timing, cache and limit option of one simulated vLLM instance.

    The defaults put a 2,000-token prompt at ~250 ms to first token uncached (4 chunked
    prefill steps of 512 tokens) and ~15 ms when its prefix is cached, and a decode step
    at ~12 ms: the shape of a mid-sized model on one GPU.
    """

    model: str = "sim-model"
    """The served model name (vLLM's --served-model-name)."""
    name: str | None = None
    """Instance name sent as x-backend-instance; default sim-<port>."""
    block_size: int = 16
    """Tokens per KV block; cached_tokens counts whole blocks, as vLLM does."""
    cache_blocks: int = 8192
    """KV cache capacity in blocks, shared by running sequences and the prefix cache."""
    max_num_seqs: int = 64
    """Most sequences running at once; the rest wait (vllm:num_requests_waiting)."""
    max_num_batched_tokens: int = 512
    """Token budget of one scheduler step: decode tokens plus chunked-prefill tokens."""
    step_ms: float = 12.0
    """Fixed cost of one scheduler step (one forward pass)."""
    prefill_token_ms: float = 0.1
    """Cost of each uncached prompt token prefilled in a step."""
    decode_seq_ms: float = 0.05
    """Cost of each running sequence that decodes a token in a step."""
    speed: float = 1.0
    """Throughput multiplier: every timing cost above is divided by it, so 0.5 is a
    backend half as fast as the others (an older GPU, a noisy neighbour)."""
    max_model_len: int = 8192
    """Longest prompt plus output accepted; longer requests get vLLM's 400."""
    default_max_tokens: int = 16
    """Output length when a request sets no max_tokens (it then ends with "stop")."""
    embedding_dim: int = 256
    instant: bool = False
    """Answer at once, with no scheduler delay: measures pure proxy overhead."""

    def __post_init__(self) -> None:
        for field in ("block_size", "cache_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be at least 1")
        if self.max_model_len < 2 or self.default_max_tokens < 1 or self.embedding_dim < 1:
            raise ValueError("max_model_len, default_max_tokens and embedding_dim must be > 0")
        if min(self.step_ms, self.prefill_token_ms, self.decode_seq_ms) < 0:
            raise ValueError("timing costs cannot be negative")
        if not self.speed > 0:
            raise ValueError("speed must be positive")
