from __future__ import annotations

from gateway.bench.routing import WORKLOADS, chosen, parse_args
from gateway.bench.workloads import MultiTurn


def test_both_workloads_by_default_as_defined() -> None:
    assert chosen(parse_args([])) == list(WORKLOADS.values())


def test_system_words_lengthens_only_the_multi_turn_system_prompt() -> None:
    workloads = chosen(parse_args(["--system-words", "1500"]))
    multi = [w for w in workloads if isinstance(w, MultiTurn)]
    assert [w.system_words for w in multi] == [1500]
    assert multi[0].conversations == WORKLOADS["multi-turn"].conversations
    assert [w for w in workloads if not isinstance(w, MultiTurn)] == [WORKLOADS["shared-prefix"]]
