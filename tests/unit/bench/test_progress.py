"""The progress bar: counts, failures and fill, redrawn in place."""

from __future__ import annotations

import io

from gateway.bench.progress import Progress


def test_bar_by_count() -> None:
    out = io.StringIO()
    bar = Progress(out, total=4, duration=None)
    for failed in (False, True, False, False):
        bar.advance(failed=failed)
    bar.close()
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("[" + "#" * 30 + "] 4/4 req")
    assert "1 failed" in last
    assert last.endswith("s\n")


def test_bar_by_time_without_a_total() -> None:
    out = io.StringIO()
    bar = Progress(out, total=None, duration=3600)
    bar.advance(failed=False)
    bar.close()
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("[" + " " * 30 + "] 1 req")
