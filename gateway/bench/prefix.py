"""What the prefix stage costs per 1,000 prompt tokens: ``python -m gateway.bench.prefix``.

Three prompts of about 1,000 tokens, each timed over ``--calls`` calls of
``PrefixHasher.key`` (tokenize, cut into blocks, chain-hash, anchor):

- ``fresh``: a new 1,000-word user message every call, so the token cache never helps
  (tiktoken does all the work);
- ``shared system prompt``: one 1,000-word system prompt and a new 24-word question each
  call, as the shared-prefix workload sends (the cached system prompt is not tokenized
  again);
- ``conversation``: a 6-turn history of ~1,000 tokens resent with a new last message, as
  multi-turn clients do.

Prints microseconds per call and per 1,000 prompt tokens (best of ``--repeat`` passes, so
another process's burst does not count against the code).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from gateway.bench.workloads import text
from gateway.flow import Request
from gateway.settings import PrefixSettings
from gateway.stages.prefix import PrefixHasher

ENCODING = "cl100k_base"
Messages = list[dict[str, str]]


def fresh(rng: random.Random) -> Callable[[int], Messages]:
    return lambda i: [{"role": "user", "content": f"{i} {text(rng, 1000)}"}]


def shared_system_prompt(rng: random.Random) -> Callable[[int], Messages]:
    system = text(rng, 1000)
    return lambda i: [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{i} {text(rng, 24)}"},
    ]


def conversation(rng: random.Random) -> Callable[[int], Messages]:
    history: Messages = [{"role": "system", "content": text(rng, 48)}]
    for _ in range(5):
        history += [
            {"role": "user", "content": text(rng, 96)},
            {"role": "assistant", "content": text(rng, 96)},
        ]
    return lambda i: [*history, {"role": "user", "content": f"{i} {text(rng, 96)}"}]


PROMPTS = {
    "fresh": fresh,
    "shared system prompt": shared_system_prompt,
    "conversation": conversation,
}


def measure(make: Callable[[int], Messages], calls: int, repeat: int) -> tuple[float, int]:
    """Best seconds per call over the passes, and the prompt's token count."""
    hasher = PrefixHasher(PrefixSettings())
    best, tokens = float("inf"), 0
    for rep in range(repeat):
        requests = [
            Request(endpoint="chat", model="m", body={"messages": make(rep * calls + i)})
            for i in range(calls)
        ]
        hasher.key(requests[0], ENCODING)  # the encoding loads once, outside the timing
        started = time.perf_counter()
        for request in requests:
            tokens = hasher.key(request, ENCODING).tokens
        best = min(best, (time.perf_counter() - started) / calls)
    return best, tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"{'prompt':<22} {'tokens':>6} {'us/call':>8} {'us/1k tokens':>12}")
    for name, make in PROMPTS.items():
        seconds, tokens = measure(make(random.Random(0)), args.calls, args.repeat)
        per_call = seconds * 1e6
        print(f"{name:<22} {tokens:>6} {per_call:>8.1f} {per_call * 1000 / tokens:>12.1f}")


if __name__ == "__main__":
    main()
