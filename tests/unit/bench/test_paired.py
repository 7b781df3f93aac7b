from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.bench.paired import parse_wrk, tree_cpu_seconds

WRK = """Running 4s test @ http://127.0.0.1:19311/v1/chat/completions
  1 threads and 16 connections
  1384 requests in 4.01s, 1.45MB read
Requests/sec:    345.12
Transfer/sec:    370.00KB
"""


def test_calls_and_rate_from_wrk() -> None:
    assert parse_wrk(WRK) == (1384, 345.12)


@pytest.mark.parametrize(
    "error",
    [
        "  Non-2xx or 3xx responses: 12\n",
        "  Socket errors: connect 0, read 0, write 0, timeout 3\n",
    ],
)
def test_a_failed_call_fails_the_run(error: str) -> None:
    with pytest.raises(RuntimeError, match="errors under load"):
        parse_wrk(WRK + error)


def test_cpu_counts_the_children_of_a_process() -> None:
    """A parent that only waits on its child is charged the child's CPU while it runs, as
    a multi-worker gateway or Granian (whose workers are child processes) must be."""
    spin = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
    parent = subprocess.Popen(
        [sys.executable, "-c",
         f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}]); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        children_cpu = 0.0
        while not _spun(parent.pid):
            children_cpu = max(children_cpu, tree_cpu_seconds(parent.pid) - _own(parent.pid))
        assert children_cpu >= 0.3
    finally:
        parent.communicate(b"")


def _stat(pid: str | int) -> list[str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2 :].split()


def _own(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spun(pid: int) -> bool:
    """The parent has waited for its child (its cutime holds the child's CPU)."""
    fields = _stat(pid)
    return int(fields[13]) + int(fields[14]) > 0
