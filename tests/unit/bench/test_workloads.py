"""Workloads: the same seed gives the same requests in any process; shapes as documented."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import Counter

from gateway.bench.words import WORDS
from gateway.bench.workloads import (
    Agents,
    Documents,
    Mixed,
    MultiTurn,
    SharedPrefix,
    Tenants,
    Tiny,
    Turn,
    Workload,
)

ALL: list[Workload] = [
    SharedPrefix(),
    MultiTurn(),
    Tiny(),
    Mixed(),
    Agents(),
    Documents(),
    Tenants(),
]


def take(workload: Workload, n: int, seed: int = 0) -> list[Turn]:
    return list(itertools.islice(workload.turns(seed), n))


def test_same_seed_same_stream_and_other_seed_differs() -> None:
    for w in ALL:
        assert take(w, 300, seed=7) == take(w, 300, seed=7), w.name
        assert take(w, 300, seed=7) != take(w, 300, seed=8), w.name


def test_stream_is_the_same_in_another_process() -> None:
    """String seeds must not depend on PYTHONHASHSEED: a fresh interpreter agrees."""
    code = (
        "import itertools;from gateway.bench.workloads import Mixed;"
        "turns = itertools.islice(Mixed().turns(3), 50);"
        "print(repr([(t.conversation, t.index, t.user) for t in turns]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "12345"},
    ).stdout
    here = [(t.conversation, t.index, t.user) for t in take(Mixed(), 50, seed=3)]
    assert out.strip() == repr(here)


def test_prompts_use_only_the_word_list_with_exact_lengths() -> None:
    vocab = {w.lower() for w in WORDS}
    for turn in take(SharedPrefix(prefix_words=40, question_words=9), 50):
        assert len(turn.system.split()) == 40
        assert len(turn.user.split()) == 9
        assert turn.user.endswith("?")
        assert {w.strip(".?").lower() for w in turn.system.split() + turn.user.split()} <= vocab


def test_shared_prefix_groups_share_system_prompts_and_questions_are_distinct() -> None:
    w = SharedPrefix(groups=3, questions=5)
    turns = take(w, w.default_requests())
    systems = Counter(t.system for t in turns)
    assert sorted(systems.values()) == [5, 5, 5]
    assert len({t.user for t in turns}) == len(turns)
    assert len({t.conversation for t in turns}) == len(turns)
    assert all(t.index == 0 and t.last and t.max_tokens == w.max_tokens for t in turns)
    # shuffled: the groups interleave rather than arriving in blocks
    firsts = [t.system for t in turns[:5]]
    assert len(set(firsts)) > 1


def test_shared_prefix_keeps_asking_new_questions_past_one_pass() -> None:
    w = SharedPrefix(groups=2, questions=3)
    turns = take(w, 4 * w.default_requests())
    assert len({t.system for t in turns}) == 2
    assert len({t.user for t in turns}) == len(turns)


def test_multi_turn_is_turn_major_within_a_wave_with_a_shared_system_prompt() -> None:
    w = MultiTurn(conversations=3, turns_per_conversation=4, system_words=5)
    turns = take(w, 2 * w.default_requests())
    assert len({t.system for t in turns}) == 1
    first_wave = turns[:12]
    assert [(t.conversation, t.index) for t in first_wave[:4]] == [
        ("mt-w0-c0", 0), ("mt-w0-c1", 0), ("mt-w0-c2", 0), ("mt-w0-c0", 1),
    ]  # fmt: skip
    by_conv: dict[str, list[int]] = {}
    for t in turns:
        by_conv.setdefault(t.conversation, []).append(t.index)
    assert len(by_conv) == 6
    assert all(indexes == [0, 1, 2, 3] for indexes in by_conv.values())
    assert [t.last for t in first_wave] == [False] * 9 + [True] * 3
    assert turns[12].conversation == "mt-w1-c0"


def test_tiny_has_no_system_prompt_and_short_answers() -> None:
    turns = take(Tiny(prompt_words=6, max_tokens=2), 10)
    assert all(t.system == "" and len(t.user.split()) == 6 and t.max_tokens == 2 for t in turns)


def test_mixed_interleaves_both_parts_each_in_its_own_order() -> None:
    w = Mixed(SharedPrefix(groups=2, questions=4), MultiTurn(conversations=2))
    turns = take(w, 200)
    shared = [t for t in turns if t.conversation.startswith("sp-")]
    multi = [t for t in turns if t.conversation.startswith("mt-")]
    assert shared
    assert multi
    assert len(shared) + len(multi) == 200
    assert shared == take(w.shared_prefix, len(shared))
    assert multi == take(w.multi_turn, len(multi))
    assert w.default_requests() == 8 + 8


def conversations(turns: list[Turn]) -> dict[str, list[Turn]]:
    by_conv: dict[str, list[Turn]] = {}
    for t in turns:
        by_conv.setdefault(t.conversation, []).append(t)
    return by_conv


def assert_whole_conversations(turns: list[Turn], lengths: tuple[int, int]) -> None:
    """Turns of a conversation come in order, and the finished ones end on a last turn
    after a number of turns within lengths."""
    for conv, mine in conversations(turns).items():
        assert [t.index for t in mine] == list(range(len(mine))), conv
        assert all(not t.last for t in mine[:-1]), conv
        if mine[-1].last:
            assert lengths[0] <= len(mine) <= lengths[1], conv


def test_agents_share_one_long_system_prompt_across_many_conversations() -> None:
    w = Agents(system_words=(700, 700), live=10, turns_per_conversation=(2, 5))
    turns = take(w, 1000)
    assert {len(t.system.split()) for t in turns} == {700}
    assert len({t.system for t in turns}) == 1
    by_conv = conversations(turns)
    assert len(by_conv) > 1000 / 5
    assert_whole_conversations(turns, (2, 5))
    assert all(16 <= len(t.user.split()) <= 160 for t in turns)
    assert {t.max_tokens for t in turns} <= set(range(16, 97))
    # a pool: at most `live` conversations are in progress at any point of the stream
    open_at_once = 0
    live: set[str] = set()
    for t in turns:
        live.add(t.conversation)
        open_at_once = max(open_at_once, len(live))
        if t.last:
            live.discard(t.conversation)
    assert open_at_once == 10


def test_agents_draw_one_system_prompt_length_per_seed_within_its_span() -> None:
    # the zoo's agents: 500-4,000 tokens (a word of this vocabulary is one cl100k token)
    lengths = {len(next(iter(Agents().turns(seed))).system.split()) for seed in range(8)}
    assert all(500 <= n <= 4000 for n in lengths)
    assert len(lengths) == 8
    # replayable: a seed draws the same length again
    assert lengths == {len(next(iter(Agents().turns(seed))).system.split()) for seed in range(8)}


def test_documents_few_long_documents_many_distinct_questions_hottest_first() -> None:
    w = Documents(documents=4, document_words=(300, 500), instruction_words=20)
    turns = take(w, 2000)
    docs = Counter(t.system for t in turns)
    assert len(docs) == 4
    assert all(320 <= len(d.split()) <= 520 for d in docs)
    # every document opens with the same instruction
    assert len({d.split("\n\n")[0] for d in docs}) == 1
    assert len({t.user for t in turns}) == len(turns)
    counts = [n for _, n in docs.most_common()]
    assert counts[0] > 2000 / 4 * 1.3  # the hottest draws more than an even share
    by_doc = Counter(t.conversation.rsplit("-q", 1)[0] for t in turns)
    assert sorted(by_doc.values()) == sorted(counts)
    assert all(t.index == 0 and t.last and t.user.endswith("?") for t in turns)


def test_tenants_differ_in_system_prompt_message_and_answer_lengths() -> None:
    w = Tenants(tenants=6, live=12)
    turns = take(w, 3000)
    by_tenant: dict[str, list[Turn]] = {}
    for t in turns:
        by_tenant.setdefault(t.conversation.split("-")[1], []).append(t)
    assert len(by_tenant) == 6
    assert len({mine[0].system for mine in by_tenant.values()}) == 6
    assert all(len({t.system for t in mine}) == 1 for mine in by_tenant.values())
    answers = [max(t.max_tokens for t in mine) for mine in by_tenant.values()]
    assert max(answers) > 2 * min(answers)
    assert_whole_conversations(turns, w.turns_per_conversation)
    singles = [c for c, mine in conversations(turns).items() if "-q" in c]
    assert singles
    assert all(len(conversations(turns)[c]) == 1 for c in singles)
