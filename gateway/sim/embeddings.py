"""POST /v1/embeddings: deterministic unit vectors, one per input, as floats or base64.

The official client asks for base64 by default; vLLM answers with little-endian float32
bytes, base64-encoded, and so does the simulator.
"""

from __future__ import annotations

import base64
import math
import random
import struct
import zlib
from typing import Any

from gateway.sim import tokenizer
from gateway.sim.config import SimConfig
from gateway.sim.protocol import SimError, prompt_too_long, random_id


def _inputs(raw: Any) -> list[list[int]]:
    """Token ids of every input: a string, a list of strings, ids, or a list of id lists."""
    if isinstance(raw, str):
        return [tokenizer.encode(raw)]
    if isinstance(raw, list) and raw:
        if all(isinstance(x, int) for x in raw):
            return [raw]
        if all(isinstance(x, str) for x in raw):
            return [tokenizer.encode(x) for x in raw]
        if all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in raw):
            return raw
    raise SimError("'input' must be a string, a list of strings or token ids", param="input")


def vector(tokens: list[int], dim: int) -> list[float]:
    """A unit vector determined by the tokens alone."""
    rng = random.Random(zlib.crc32(str(tokens).encode()))
    v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


def embeddings_response(body: dict[str, Any], config: SimConfig, created: int) -> dict[str, Any]:
    inputs = _inputs(body.get("input"))
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise SimError("encoding_format must be 'float' or 'base64'", param="encoding_format")
    for tokens in inputs:
        if len(tokens) > config.max_model_len:
            raise prompt_too_long(len(tokens), config.max_model_len)
    data = []
    for i, tokens in enumerate(inputs):
        v = vector(tokens, config.embedding_dim)
        emb: Any = (
            v if fmt == "float" else base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
        )
        data.append({"index": i, "object": "embedding", "embedding": emb})
    n = sum(len(t) for t in inputs)
    return {
        "id": f"embd-{random_id()}",
        "object": "list",
        "created": created,
        "model": config.model,
        "data": data,
        "usage": {
            "prompt_tokens": n,
            "total_tokens": n,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }
