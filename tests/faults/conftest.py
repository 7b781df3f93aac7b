"""Fault experiments: the suite's own stores, and the figures each experiment measured.

`pytest tests/faults` ends with a table of those figures (the README's fault table).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.cluster import Stores, private_stores
from tests.faults.load import Load

FIGURES = pytest.StashKey[list[tuple[str, str]]]()
EXPERIMENT_TIMEOUT = 600
"""Seconds an experiment may take: it starts a cluster of processes and waits out its
fault, which on a loaded machine takes minutes, not the suite's default two. Each
experiment's own deadlines end it well before this when something hangs."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.timeout(EXPERIMENT_TIMEOUT))


@pytest.fixture(scope="package")
def stores() -> Iterator[Stores]:
    """A private Postgres cluster and redis-server: the experiments may stop either."""
    with private_stores() as s:
        yield s


class Figures:
    """Where an experiment leaves what it measured, for the summary table."""

    def __init__(self, config: pytest.Config) -> None:
        self._rows = config.stash.setdefault(FIGURES, [])

    def add(self, experiment: str, load: Load, **measured: object) -> None:
        extra = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in measured.items())
        self._rows.append((experiment, load.summary() + (f"; {extra}" if extra else "")))


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    return Figures(request.config)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    rows = terminalreporter.config.stash.get(FIGURES, [])
    if rows:
        terminalreporter.section("fault experiments")
        for experiment, measured in rows:
            terminalreporter.write_line(f"{experiment}: {measured}")
