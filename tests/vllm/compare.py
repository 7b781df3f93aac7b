"""Compare a running server (the simulator) with the stored real-vLLM fixtures, offline.

    python -m tests.vllm.compare http://127.0.0.1:8000

Sends each fixture's request and prints every difference in shape, framing and error
body (the live conformance test does the same against a running vLLM). Exit status 1
when anything differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from tests.vllm import capture
from tests.vllm.shapes import answer_diff

FIXTURES = Path(__file__).parent / "fixtures"


def main(argv: list[str]) -> int:
    failed = False
    with httpx.Client(base_url=argv[0], timeout=60) as client:
        for name, (path, body) in {**capture.PLAIN, **capture.STREAMS}.items():
            record = capture.stream if name in capture.STREAMS else capture.plain
            diffs = answer_diff(
                json.loads((FIXTURES / f"{name}.json").read_text()), record(client, path, body)
            )
            failed |= bool(diffs)
            print(f"{name}: {'ok' if not diffs else ''}")  # noqa: T201
            for line in diffs:
                print(f"  {line}")  # noqa: T201
    return int(failed)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
