"""`gateway sim`: one or several simulated vLLM instances in one process.

`gateway sim --instances 4 --port 9001 --cache-blocks 4096,4096,1024,1024` serves four
instances on ports 9001-9004 from one event loop (on two cores, one loop beats
several processes), each with its own engine, prefix cache and metrics;
`--speed 1,1,1,0.5` makes the last one half as fast as the others.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Callable
from typing import TypeVar

from gateway.sim.config import SimConfig
from gateway.sim.server import RunningSimulator, start_simulator

_DEFAULTS = SimConfig()
T = TypeVar("T")


# SimConfig fields offered as --field-name options, with their type and help text; the
# defaults are SimConfig's own.
_TUNABLES: tuple[tuple[str, type, str], ...] = (
    ("model", str, "served model name"),
    ("block_size", int, "tokens per KV block"),
    ("max_num_seqs", int, "most sequences running at once"),
    ("max_num_batched_tokens", int, "token budget of one step (chunked prefill)"),
    ("step_ms", float, "fixed cost of one scheduler step"),
    ("prefill_token_ms", float, "cost per uncached prompt token prefilled"),
    ("decode_seq_ms", float, "cost per decoding sequence per step"),
    ("max_model_len", int, "longest prompt plus output accepted"),
    ("default_max_tokens", int, "output length when a request sets no max_tokens"),
    ("embedding_dim", int, "embedding vector size"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000, help="port of the first instance (default 8000)")
    a("--instances", type=int, default=1, help="instances on consecutive ports (default 1)")
    a("--name", help="instance name for x-backend-instance (default sim-<port>)")
    a(
        "--cache-blocks",
        default=str(_DEFAULTS.cache_blocks),
        help=f"KV blocks, one value or a list per instance (default {_DEFAULTS.cache_blocks})",
    )
    a(
        "--speed",
        default=str(_DEFAULTS.speed),
        help="throughput multiplier (timings divided by it), one value or a list per instance",
    )
    a("--instant", action="store_true", help="answer at once, no scheduler delay")
    for field, kind, text in _TUNABLES:
        default = getattr(_DEFAULTS, field)
        a(
            f"--{field.replace('_', '-')}",
            type=kind,
            default=default,
            help=f"{text} (default {default})",
        )


def configs(args: argparse.Namespace) -> list[SimConfig]:
    """One SimConfig per instance, from the parsed arguments."""
    n = args.instances
    if n < 1:
        raise SystemExit("--instances must be at least 1")
    blocks = per_instance("--cache-blocks", args.cache_blocks, n, int)
    speeds = per_instance("--speed", args.speed, n, float)
    if args.name and n > 1:
        raise SystemExit("--name names a single instance; several get sim-<port>")
    tunables = {field: getattr(args, field) for field, _, _ in _TUNABLES}
    try:
        return [
            SimConfig(name=args.name, instant=args.instant, cache_blocks=b, speed=v, **tunables)
            for b, v in zip(blocks, speeds, strict=True)
        ]
    except ValueError as exc:
        raise SystemExit(f"gateway sim: {exc}") from exc


def per_instance(option: str, value: str, n: int, kind: Callable[[str], T]) -> list[T]:
    """One value for every instance, or a comma-separated list of exactly n."""
    try:
        values = [kind(v) for v in str(value).split(",")]
    except ValueError as exc:
        raise SystemExit(f"gateway sim: {option}: {exc}") from exc
    if len(values) == 1:
        values *= n
    if len(values) != n:
        raise SystemExit(f"{option} lists {len(values)} values for {n} instances")
    return values


async def _serve(args: argparse.Namespace, cfgs: list[SimConfig]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sims: list[RunningSimulator] = []
    try:
        for i, cfg in enumerate(cfgs):
            port = args.port + i
            try:
                sim = await start_simulator(cfg, args.host, port)
            except OSError as exc:
                raise SystemExit(
                    f"gateway sim: cannot listen on {args.host}:{port}: {exc}"
                ) from exc
            sims.append(sim)
            print(
                f"{sim.name} serving {cfg.model} on {sim.url} "
                f"(cache {cfg.cache_blocks} blocks, speed {cfg.speed:g})",
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
