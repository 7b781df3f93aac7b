"""Argument handling: targets, headers, workload overrides, options."""

from __future__ import annotations

import argparse

import pytest

from gateway.bench.cli import options_from_args, parse_headers, parse_target, workload_from_args
from gateway.bench.workloads import Mixed, MultiTurn, SharedPrefix
from gateway.cli import build_parser


def parse(*argv: str) -> argparse.Namespace:
    args = ["bench", *argv]
    return build_parser(args).parse_args(args)


def test_target_with_and_without_label() -> None:
    t = parse_target("rr=http://127.0.0.1:8081/v1/", "k", {"x": "1"})
    assert (t.label, t.base_url, t.api_key, dict(t.headers)) == (
        "rr", "http://127.0.0.1:8081/v1", "k", {"x": "1"},
    )  # fmt: skip
    bare = parse_target("http://h:1/v1?a=b", None, {})
    assert (bare.label, bare.base_url, bare.name) == ("", "http://h:1/v1?a=b", "http://h:1/v1?a=b")


def test_headers() -> None:
    assert parse_headers(["x-session-id: abc", "X-A:b:c"]) == {"x-session-id": "abc", "X-A": "b:c"}
    with pytest.raises(SystemExit):
        parse_headers(["nocolon"])


def test_workload_flags_override_only_what_is_given() -> None:
    args = parse("run", "--base-url", "http://h/v1", "--groups", "3", "--max-tokens", "7")
    w = workload_from_args(args)
    assert w == SharedPrefix(groups=3, max_tokens=7)
    mixed = workload_from_args(
        parse("run", "--base-url", "u", "--workload", "mixed", "--turns", "2")
    )
    assert mixed == Mixed(SharedPrefix(), MultiTurn(turns_per_conversation=2))


def test_options_and_exclusive_load() -> None:
    args = parse("compare", "--target", "a=u", "--target", "b=v", "--rate", "3", "--duration",
                 "9", "--session-header", "--no-ignore-eos", "--no-progress")  # fmt: skip
    opts = options_from_args(args)
    assert (opts.rate, opts.duration, opts.concurrency) == (3.0, 9.0, None)
    assert opts.session_header is True
    assert opts.ignore_eos is False
    assert opts.progress is False
    assert args.isolate is True
    with pytest.raises(SystemExit):
        parse("run", "--base-url", "u", "--rate", "1", "--concurrency", "2")
    with pytest.raises(SystemExit):
        parse("--workload", "tiny")
