"""Heap reports from a running gateway, for the soak benchmark: one on each SIGUSR1.

    python -m gateway.bench.traced DIR [--tracemalloc] serve --config gateway.yaml

The gateway's own command line runs, with a signal handler beside it. Each SIGUSR1
collects garbage and writes ``DIR/NNN.json``: allocated blocks before and after the
collection, the collector's counts and per-generation statistics, the census of objects
the collector tracks that were made after start (the gateway freezes its startup heap,
so these are exactly what calls left behind: cached, in flight, or leaked) by type, the
largest containers among them with what holds each, the size of every container
reachable from the running ``Services`` (each cache) and of every ``functools`` cache
in the package. A report costs one full collection and a walk of those objects.

``--tracemalloc`` also traces allocations from the first report on and writes
``DIR/NNN.snapshot``; tracing from the start would cost half a minute of tokenizer
loading, and tracing costs the gateway most of its speed (each small allocation records
its frames), so that is a run to find where memory goes, never one to measure RSS.
:func:`compare` reads two reports back and prints what grew between them. Only the soak
benchmark starts the gateway this way; it is no setting of the gateway.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import json
import linecache
import os
import signal
import sys
import traceback
import tracemalloc
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import BaseModel

FRAMES = 12
"""Frames kept per allocation: enough to reach the gateway's own code from a library's."""
TOP = 25
CONTAINERS = (dict, list, set, frozenset, collections.deque)


def main(argv: list[str]) -> int:
    directory = Path(argv[0])
    directory.mkdir(parents=True, exist_ok=True)
    trace = argv[1:2] == ["--tracemalloc"]
    taken = [0]

    def on_signal(signum: int, frame: FrameType | None) -> None:
        """Runs between two bytecodes of whatever the loop was doing (a send, say): the
        report waits for the loop's next turn, so nothing it raises lands in a call."""
        if trace and not tracemalloc.is_tracing():
            tracemalloc.start(FRAMES)
        taken[0] += 1
        asyncio.get_running_loop().call_soon(report, directory / f"{taken[0]:03d}")

    signal.signal(signal.SIGUSR1, on_signal)
    keep_services()
    from gateway.cli import main as gateway_main

    return gateway_main(argv[1 + trace :])


SERVICES: list[Any] = []
"""The gateway's Services once open. Looked up here, not among the collector's objects:
the gateway freezes its startup heap, and frozen objects are not listed."""


def keep_services() -> None:
    """Wrap ``Services.open`` so the Services it opens are kept in SERVICES."""
    from gateway.services import Services

    opener = Services.open

    @contextlib.asynccontextmanager
    async def open_and_keep(settings: Any) -> AsyncIterator[Services]:
        async with opener(settings) as services:
            SERVICES.append(services)
            yield services

    Services.open = open_and_keep  # type: ignore[method-assign]


def report(stem: Path) -> None:
    """Write the JSON figures and, when tracing, the snapshot beside them (see the module
    docstring); if that fails, the error as the JSON, so whoever waits for it learns why."""
    try:
        figures = heap_figures()
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot().filter_traces(NOT_TRACEMALLOC)
            snapshot.dump(str(stem.with_suffix(".snapshot")))
    except Exception:  # noqa: BLE001 - a benchmark's probe: report, never break the server
        figures = {"error": traceback.format_exc()}
    partial = stem.with_suffix(".partial")
    partial.write_text(json.dumps(figures, indent=1))
    partial.replace(stem.with_suffix(".json"))  # whole, for the benchmark waiting on it


NOT_TRACEMALLOC = [
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<unknown>"),
]


def heap_figures() -> dict[str, Any]:
    before = sys.getallocatedblocks()
    gc.collect()
    objects = gc.get_objects()
    types = collections.Counter(type(o).__qualname__ for o in objects)
    figures = {
        "blocks_before_collect": before,
        "blocks": sys.getallocatedblocks(),
        "gc_counts": gc.get_count(),
        "gc_stats": gc.get_stats(),
        "gc_objects": len(objects),
        "types": types.most_common(40),
        "largest": largest(objects),
        "containers": dict(sorted(cache_sizes().items())),
        "traced_mb": tracemalloc.get_traced_memory()[0] / 2**20,
    }
    del objects
    return figures


def largest(objects: list[Any], count: int = 12) -> list[str]:
    """The longest containers among objects, each with what refers to it."""
    sized = [o for o in objects if isinstance(o, CONTAINERS)]
    sized.sort(key=len, reverse=True)
    top = sized[:count]
    ours = {id(objects), id(sized), id(top)}
    return [f"{type(o).__qualname__} of {len(o):,} in {holders(o, ours)}" for o in top]


def holders(obj: Any, ours: set[int]) -> str:
    """What refers to obj (but the census lists ``ours`` and frames): the referrer's type,
    with the key or attribute under which it holds obj."""
    names = []
    refs = [r for r in gc.get_referrers(obj) if id(r) not in ours and not isinstance(r, FrameType)]
    for ref in refs[:4]:
        pairs = ref.items() if isinstance(ref, dict) else attributes(ref)
        name = key_of(obj, pairs)  # a loop, not a closure: a closure's cell would hold obj
        if isinstance(ref, dict):
            names.append(f"dict[{name!r}]" if name is not None else "dict")
        else:
            names.append(type(ref).__qualname__ + (f".{name}" if name is not None else ""))
    return ", ".join(names) or "nothing tracked"


def key_of(obj: Any, pairs: Iterable[tuple[Any, Any]]) -> Any:
    for key, value in pairs:
        if value is obj:
            return key
    return None


def cache_sizes() -> dict[str, int]:
    """Length of each container (and each object with a length) under the Services, by
    attribute path; and each ``functools`` cache of a gateway module, by function."""
    out: dict[str, int] = {}
    for svc in SERVICES:
        out.update(walk(svc, "services", set(), depth=6))
    for name, module in list(sys.modules.items()):
        if not name.startswith("gateway."):
            continue
        for attr, value in vars(module).items():
            if isinstance(value, functools._lru_cache_wrapper):
                out[f"{name}.{attr}()"] = value.cache_info().currsize
    return out


def walk(obj: Any, path: str, seen: set[int], depth: int) -> Iterator[tuple[str, int]]:
    """(path, length) of every sized attribute reachable from obj through the gateway's
    own objects (settings aside: they do not change), and through small mappings of them
    by name (backends, say); text and bytes are values, not containers."""
    if id(obj) in seen or depth < 0 or isinstance(obj, str | bytes | BaseModel):
        return
    seen.add(id(obj))
    ours = type(obj).__module__.startswith("gateway")
    if isinstance(obj, CONTAINERS) or (ours and hasattr(type(obj), "__len__")):
        yield path, len(obj)
        if isinstance(obj, dict) and len(obj) <= 16:
            for key, value in obj.items():
                if isinstance(key, str):
                    yield from walk(value, f"{path}[{key!r}]", seen, depth - 1)
    if not ours:
        return
    for name, value in attributes(obj):
        yield from walk(value, f"{path}.{name}", seen, depth - 1)


def attributes(obj: Any) -> Iterator[tuple[str, Any]]:
    yield from getattr(obj, "__dict__", {}).items()
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name):
                yield name, getattr(obj, name)


def compare(first: Path, last: Path, out: Any = sys.stdout) -> None:
    """Print what grew from report ``first`` to report ``last``: blocks, object types,
    container sizes, and the allocation sites that gained the most, by count and bytes."""
    a, b = (json.loads(p.with_suffix(".json").read_text()) for p in (first, last))
    print(f"\nheap {first.name} -> {last.name}: blocks {a['blocks']:,} -> {b['blocks']:,}, "
          f"gc objects {a['gc_objects']:,} -> {b['gc_objects']:,}", file=out)  # fmt: skip
    print(f"gc stats at the end: {b['gc_stats']}", file=out)
    types_a = dict(a["types"])
    grown = sorted(((n - types_a.get(t, 0), t, n) for t, n in b["types"]), reverse=True)
    print("object types (gain, type, count):", file=out)
    for gain, name, count in grown[:12]:
        print(f"  {gain:+,} {name} {count:,}", file=out)
    print("containers that changed (path: first -> last):", file=out)
    for path, size in b["containers"].items():
        if a["containers"].get(path) != size:
            print(f"  {path}: {a['containers'].get(path)} -> {size}", file=out)
    print("largest containers made after start, at the end:", file=out)
    for line in b["largest"]:
        print(f"  {line}", file=out)
    if not last.with_suffix(".snapshot").exists():
        return
    snaps = [tracemalloc.Snapshot.load(str(p.with_suffix(".snapshot"))) for p in (first, last)]
    diff = snaps[1].compare_to(snaps[0], "traceback")
    for title, key in (("blocks", "count_diff"), ("bytes", "size_diff")):
        print(f"allocation sites gaining the most {title}:", file=out)
        for stat in sorted(diff, key=lambda s: getattr(s, key), reverse=True)[: TOP // 2]:
            print(f"  {stat.count_diff:+,} blocks {stat.size_diff / 1024:+,.0f} KiB "
                  f"(now {stat.count:,}, {stat.size / 1024:,.0f} KiB)", file=out)  # fmt: skip
            for frame in where(stat.traceback):
                print(f"      {frame}", file=out)


def where(traceback: tracemalloc.Traceback) -> list[str]:
    """The innermost frames, up to and including the first in the gateway's own code."""
    lines = []
    for frame in reversed(traceback):
        text = linecache.getline(frame.filename, frame.lineno).strip()
        lines.append(f"{short(frame.filename)}:{frame.lineno} {text}")
        if f"{os.sep}gateway{os.sep}" in frame.filename and len(lines) > 1:
            break
    return lines[:6]


def short(filename: str) -> str:
    for marker in ("site-packages" + os.sep, os.sep + "gateway" + os.sep):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
