"""Real servers on loopback for tests: spawn a process, wait until it answers, stop it.

Tests drive the gateway and the simulator as separate processes over real sockets, as
users do; this is the one helper that starts and stops them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT", "consecutive_free_ports", "free_port", "gateway_process", "wait_http"]


def consecutive_free_ports(n: int) -> int:
    """A port P with P..P+n-1 all free now: a bare free port's neighbour is often taken
    on a busy machine (outgoing connections use the same ephemeral range)."""
    for _ in range(50):
        base = free_port()
        try:
            for port in range(base + 1, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {n} consecutive free ports found")


def wait_http(
    url: str,
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = 30,
    log: Path | None = None,
) -> None:
    """Poll url until it answers 2xx; fail with the process's output if it dies or hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = log.read_text(errors="replace") if log else ""
            raise RuntimeError(f"server exited with {proc.returncode} before answering:\n{out}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).is_success:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


@contextlib.contextmanager
def gateway_process(
    *args: str,
    health_path: str = "/health",
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30,
) -> Iterator[str]:
    """Run `python -m gateway <args> --port P` and yield its base URL (http://127.0.0.1:P).

    The process gets SIGTERM on exit (SIGKILL after 10 s), so a test that fails still
    leaves no server behind.
    """
    port = port or free_port()
    cmd = [sys.executable, "-m", "gateway", *args, "--port", str(port)]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    # Output goes to a file, not a pipe: a chatty server must never block on a full pipe.
    log_file = tempfile.NamedTemporaryFile(prefix="gw-proc-", suffix=".log", delete=False)  # noqa: SIM115
    log = Path(log_file.name)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log_file, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + health_path, proc, timeout, log)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()
        log.unlink(missing_ok=True)
