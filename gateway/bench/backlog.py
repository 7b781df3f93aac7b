"""What routing pays per backend per decision to see its load: ``python -m gateway.bench.backlog``.

Every routing decision reads each candidate's :meth:`gateway.backlog.Backlog.load`: the
prefill queued by our calls, the decode pace and, once the engine's sequence slots are
known to be full, when a call sent now would get one. On a GPU engine running hundreds of
sequences that is hundreds of calls in flight per backend, read for every backend on every
decision. This times it with ``N`` of our calls in flight on one backend whose slot count
is known: a tenth of them still prefilling, the rest streaming their answers, and as many
queued for a slot as are in flight beyond the slots.

Prints microseconds per ``load()`` (best of ``--repeat`` timings, so another process's
burst does not count against the code).
"""

from __future__ import annotations

import argparse
import time
import timeit
from functools import partial

from gateway.backlog import Backlog
from gateway.flow import Call, Route
from gateway.stages.parse import parse

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":200}'
SHAPES = ((16, 8), (64, 32), (256, 256), (1024, 256))
"""(calls in flight, sequence slots): a small engine, a CPU one, a GPU one full, and one
with three calls queued for every slot."""


def backlog(in_flight: int, slots: int) -> Backlog:
    """A backend with ``in_flight`` of our calls, sent a second ago; most answering."""
    b = Backlog(slots=slots, peak=slots)
    now = time.perf_counter()
    for i in range(in_flight):
        call = Call(path="/v1/chat/completions", headers={}, id=str(i))
        call.request = parse(BODY, "chat", None)
        call.route = Route(backend="b", decision="hit", uncached_tokens=100)
        call.route.expected_ttft = 0.05
        call.dispatched_at = now - 1.0
        b.admit(call)
        if i % 10:
            call.first_byte_at, call.events = now - 0.5, 40
    return b


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gateway.bench.backlog")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    print("| calls in flight | slots | us per load() |\n|---|---|---|")
    for in_flight, slots in SHAPES:
        b = backlog(in_flight, slots)
        timer = timeit.Timer(partial(b.load, 5, in_flight, 0.5, slots))
        number, _ = timer.autorange()
        best = min(timer.repeat(args.repeat, number)) / number
        print(f"| {in_flight:,} | {slots} | {best * 1e6:.1f} |")


if __name__ == "__main__":
    main()
