"""Real servers on loopback for tests: spawn a process, wait until it answers, stop it.

Tests drive the gateway and the simulator as separate processes over real sockets, as
users do; this is the one helper that starts and stops them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import yaml

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent

__all__ = [
    "ROOT",
    "Server",
    "consecutive_free_ports",
    "free_port",
    "gateway_process",
    "prometheus_process",
    "server_process",
    "server_processes",
    "wait_http",
]


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
    timeout: float = 90,
    log: Path | None = None,
) -> None:
    """Poll url until it answers 2xx; fail with the process's output if it dies or hangs.

    The deadline only bounds a start that never comes: a gateway with two workers on a
    saturated 2-core machine took 37 s to answer, and waiting longer costs nothing when
    it answers sooner.
    """
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1) as client:  # one client: each new one loads the CA store
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                out = log.read_text(errors="replace") if log else ""
                raise RuntimeError(f"server exited with {proc.returncode} before answering:\n{out}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).is_success:
                    return
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


@dataclass(frozen=True)
class Server:
    """A started server process: its base URL, the process, and where its output goes."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def server_process(
    *args: str,
    health_path: str = "/health",
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 90,
) -> Iterator[Server]:
    """Run `python -m gateway <args> --port P` and yield it once it answers."""
    with server_processes([*args, "--port", str(port or free_port())], health_path=health_path,
                          env=env, timeout=timeout) as [server]:  # fmt: skip
        yield server


@contextlib.contextmanager
def server_processes(
    *commands: Sequence[str],
    health_path: str = "/health",
    env: dict[str, str] | None = None,
    timeout: float = 90,
) -> Iterator[list[Server]]:
    """Start `python -m gateway <command>` for each command at once, and yield them once all
    answer: each command ends with `--port P`. Starting together saves the seconds each
    spends importing on a busy machine.

    Each process gets SIGTERM on exit (SIGKILL after 10 s; SIGCONT first, in case a test
    froze it), so a test that fails still leaves no server behind.
    """
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    started: list[tuple[Server, IO[bytes]]] = []
    try:
        for command in commands:
            # Output goes to a file, not a pipe: a chatty server must never block on it.
            log_file = tempfile.NamedTemporaryFile(prefix="gw-proc-", suffix=".log", delete=False)  # noqa: SIM115
            cmd = [sys.executable, "-m", "gateway", *command]
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=full_env, stdout=log_file, stderr=subprocess.STDOUT
            )
            url = f"http://127.0.0.1:{command[-1]}"
            started.append((Server(url, proc, Path(log_file.name)), log_file))
        for server, _ in started:
            wait_http(server.url + health_path, server.proc, timeout, server.log)
        yield [server for server, _ in started]
    finally:
        for server, log in started:
            stop(server.proc)
            log.close()
            server.log.unlink(missing_ok=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def gateway_process(
    *args: str,
    health_path: str = "/health",
    port: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 90,
) -> Iterator[str]:
    """Run `python -m gateway <args> --port P` and yield its base URL (http://127.0.0.1:P)."""
    with server_process(*args, health_path=health_path, port=port, env=env,
                        timeout=timeout) as server:  # fmt: skip
        yield server.url


@contextlib.contextmanager
def prometheus_process(config: dict[str, object], workdir: Path) -> Iterator[str]:
    """Run a real Prometheus (Debian's `prometheus` package; .ci/run installs it) with this
    config on a free loopback port, its data in workdir, and yield its base URL. A
    system Prometheus on :9090, if any, is never involved."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: apt-get install prometheus (.ci/run does)"
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={url.removeprefix('http://')}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_http(url + "/-/ready", proc, log=log)
            yield url
        finally:
            stop(proc)
