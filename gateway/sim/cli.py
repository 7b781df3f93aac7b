"""`gateway sim`: one or several simulated vLLM instances in one process.

`gateway sim --instances 4 --port 9001 --cache-blocks 4096,4096,1024,1024` serves four
instances on ports 9001-9004 from one event loop (on two cores, one loop beats
several processes), each with its own engine, prefix cache and metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
from collections.abc import Callable

from gateway.sim.config import SimConfig
from gateway.sim.server import RunningSimulator, start_simulator

_DEFAULTS = SimConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    a = parser.add_argument
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000, help="port of the first instance (default 8000)")
    a("--instances", type=int, default=1, help="instances on consecutive ports (default 1)")
    a("--model", default=d.model, help=f"served model name (default {d.model})")
    a("--name", default=None, help="instance name for x-backend-instance (default sim-<port>)")
    a(
        "--cache-blocks",
        default=str(d.cache_blocks),
        help=f"KV blocks: one value, or a comma list per instance (default {d.cache_blocks})",
    )
    a(
        "--block-size",
        type=int,
        default=d.block_size,
        help=f"tokens per block (default {d.block_size})",
    )
    a("--max-num-seqs", type=int, default=d.max_num_seqs, help=f"(default {d.max_num_seqs})")
    a(
        "--max-num-batched-tokens",
        type=int,
        default=d.max_num_batched_tokens,
        help=f"token budget per step, chunked prefill (default {d.max_num_batched_tokens})",
    )
    a("--step-ms", type=float, default=d.step_ms, help=f"fixed cost per step (default {d.step_ms})")
    a(
        "--prefill-token-ms",
        type=float,
        default=d.prefill_token_ms,
        help=f"cost per uncached prompt token (default {d.prefill_token_ms})",
    )
    a(
        "--decode-seq-ms",
        type=float,
        default=d.decode_seq_ms,
        help=f"cost per decoding sequence per step (default {d.decode_seq_ms})",
    )
    a("--max-model-len", type=int, default=d.max_model_len, help=f"(default {d.max_model_len})")
    a(
        "--default-max-tokens",
        type=int,
        default=d.default_max_tokens,
        help=f"output length when max_tokens is absent (default {d.default_max_tokens})",
    )
    a("--embedding-dim", type=int, default=d.embedding_dim, help=f"(default {d.embedding_dim})")
    a("--instant", action="store_true", help="answer at once, no scheduler delay")


def configs(args: argparse.Namespace) -> list[SimConfig]:
    """One SimConfig per instance, from the parsed arguments."""
    n = args.instances
    if n < 1:
        raise SystemExit("--instances must be at least 1")
    blocks = [int(b) for b in str(args.cache_blocks).split(",")]
    if len(blocks) == 1:
        blocks *= n
    if len(blocks) != n:
        raise SystemExit(f"--cache-blocks lists {len(blocks)} values for {n} instances")
    if args.name and n > 1:
        raise SystemExit("--name names a single instance; several get sim-<port>")
    base = SimConfig(
        model=args.model,
        name=args.name,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        step_ms=args.step_ms,
        prefill_token_ms=args.prefill_token_ms,
        decode_seq_ms=args.decode_seq_ms,
        max_model_len=args.max_model_len,
        default_max_tokens=args.default_max_tokens,
        embedding_dim=args.embedding_dim,
        instant=args.instant,
    )
    return [dataclasses.replace(base, cache_blocks=b) for b in blocks]


async def _serve(args: argparse.Namespace, cfgs: list[SimConfig]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sims: list[RunningSimulator] = []
    try:
        for i, cfg in enumerate(cfgs):
            sim = await start_simulator(cfg, args.host, args.port + i)
            sims.append(sim)
            print(
                f"{sim.name} serving {cfg.model} on {sim.url} (cache {cfg.cache_blocks} blocks)",
                flush=True,
            )
        await stop.wait()
    finally:
        for sim in sims:
            await sim.aclose()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # uvloop is optional (no Windows build); asyncio's loop works
        return None
    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> int:
    cfgs = configs(args)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(args, cfgs))
    return 0
