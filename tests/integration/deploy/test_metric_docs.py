"""Every metric the running app registers is in deploy/README.md's table, with its type,
its labels and a meaning; and the table lists nothing the app does not register."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from tests.integration.conftest import InProcess
from tests.unit.deploy.conftest import DEPLOY

ROW = re.compile(
    r"^\| `(?P<name>[\w:]+)` \| (?P<type>\w+) \|(?P<labels>[^|]*)\| (?P<meaning>.*) \|$"
)


def documented() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """The README's metrics table: name -> (type, labels, meaning)."""
    text = (DEPLOY / "README.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if m := ROW.match(line):
            labels = tuple(re.findall(r"`(\w+)`", m["labels"]))
            assert m["name"] not in rows, f"{m['name']} is listed twice"
            rows[m["name"]] = (m["type"], labels, m["meaning"].strip())
    return rows


def registered(registry: CollectorRegistry) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric on the registry: name as scraped -> (type, label names).

    A labelled metric shows its labels only once a child exists, so they are read from
    prometheus-client's metric objects (_name, _type, _labelnames), not from a scrape.
    """
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for collector, names in registry._collector_to_names.items():
        if not names:  # collects no series of its own (gateway.metrics.Added)
            continue
        assert isinstance(collector, MetricWrapperBase), collector
        kind = collector._type
        assert kind is not None, collector
        suffix = "_total" if kind == "counter" else ""
        out[collector._name + suffix] = (kind, tuple(collector._labelnames))
    return out


async def test_every_registered_metric_is_documented_with_its_labels(
    in_process: InProcess,
) -> None:
    have = registered(in_process.services.registry)
    docs = documented()
    assert len(have) > 30
    missing = sorted(set(have) - set(docs))
    assert not missing, f"deploy/README.md's metrics table lacks {missing}"
    stale = sorted(set(docs) - set(have))
    assert not stale, f"deploy/README.md documents metrics nobody registers: {stale}"
    for name, (kind, labels) in have.items():
        doc_kind, doc_labels, meaning = docs[name]
        assert (doc_kind, doc_labels) == (kind, labels), name
        assert len(meaning.split()) >= 4, f"{name}: say what it counts"


def test_the_table_parser_reads_labels_and_meaning() -> None:
    line = "| `gateway_x_total` | counter | `model`, `kind` | calls by kind, for graphs |"
    m = ROW.match(line)
    assert m is not None
    assert (m["name"], m["type"], re.findall(r"`(\w+)`", m["labels"])) == (
        "gateway_x_total",
        "counter",
        ["model", "kind"],
    )
    assert ROW.match("| `gateway_y` | gauge | | rows waiting |") is not None
