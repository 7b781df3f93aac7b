"""End-to-end fixtures: simulators and gateways as real processes on loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path

import pytest
import yaml

from tests.servers import gateway_process

MODEL = "sim-model"


def write_config(
    path: Path, backends: list[str], price: dict[str, str] | None = None, **sections: object
) -> Path:
    """A gateway YAML config serving MODEL from the given backend URLs.

    The ledger (SQLite unless a section says otherwise) and its spool live beside it.
    """
    model: dict[str, object] = {"name": MODEL, "backends": [{"url": u} for u in backends]}
    if price is not None:
        model["price"] = price
    config = {
        "models": [model],
        "database": {"url": f"sqlite:///{path.parent / 'ledger.db'}"},
        "ledger": {"spool_dir": str(path.parent / "spool")},
        **sections,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def start_sims(stack: ExitStack, n: int, *extra: str) -> list[str]:
    return [stack.enter_context(gateway_process("sim", "--model", MODEL, *extra)) for _ in range(n)]


@pytest.fixture(scope="module")
def sims() -> Iterator[list[str]]:
    """Two simulator processes with the default (vLLM-like) timings."""
    with ExitStack() as stack:
        yield start_sims(stack, 2)


GatewayFactory = Callable[..., AbstractContextManager[str]]


@pytest.fixture(scope="module")
def gateway_url(sims: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway in front of the two simulators; yields its base URL (no /v1)."""
    cfg = write_config(tmp_path_factory.mktemp("gw") / "gateway.yaml", sims)
    with gateway_process("serve", "--config", str(cfg)) as url:
        yield url
