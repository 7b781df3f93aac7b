from __future__ import annotations

from typing import Any

import pytest

from gateway.flow import Request
from gateway.settings import PrefixSettings, SettingsError
from gateway.stages.prefix import (
    PIECE_CHARS,
    PieceCache,
    PrefixHasher,
    block_hashes,
    load_encoding,
    pieces,
)

ENC = "cl100k_base"


def chat(*messages: tuple[str, str], **extra: Any) -> Request:
    body = {"messages": [{"role": r, "content": c} for r, c in messages], **extra}
    return Request(endpoint="chat", model="m", body=body)


def completion(prompt: Any) -> Request:
    return Request(endpoint="completions", model="m", body={"prompt": prompt})


@pytest.fixture
def hasher() -> PrefixHasher:
    return PrefixHasher(PrefixSettings(block_size=16))


def test_blocks_cut_whole_blocks_only(hasher: PrefixHasher) -> None:
    key = hasher.key(completion(list(range(40))), ENC)
    assert key.tokens == 40
    assert len(key.hashes) == 2
    assert key.block_size == 16


def test_hashes_chain_so_each_names_its_whole_prefix(hasher: PrefixHasher) -> None:
    a = hasher.key(completion(list(range(48))), ENC).hashes
    b = hasher.key(completion([*range(32), 999, *range(33, 48)]), ENC).hashes
    c = hasher.key(completion([7, *range(1, 48)]), ENC).hashes
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    # A change in the first block changes every later hash, although those blocks agree.
    assert all(x != y for x, y in zip(a, c, strict=True))


def test_same_block_at_another_depth_hashes_differently(hasher: PrefixHasher) -> None:
    hashes = hasher.key(completion([5] * 48), ENC).hashes
    assert len(set(hashes)) == 3


def test_keys_are_deterministic_across_hashers_and_cache_sizes() -> None:
    req = chat(("system", "You are terse."), ("user", "Tell me about tides. " * 20))
    cached = PrefixHasher(PrefixSettings())
    uncached = PrefixHasher(PrefixSettings(token_cache_mb=0))
    first = cached.key(req, ENC)
    assert cached.key(req, ENC) == first
    assert uncached.key(req, ENC) == first
    assert first.hashes
    assert first.tokens >= 16 * len(first.hashes)


def test_max_blocks_bounds_the_hashes_not_the_token_count() -> None:
    hasher = PrefixHasher(PrefixSettings(block_size=4, max_blocks=3))
    key = hasher.key(completion(list(range(100))), ENC)
    assert key.tokens == 100
    assert len(key.hashes) == 3


def test_next_turn_repeats_this_turns_blocks_as_its_prefix(hasher: PrefixHasher) -> None:
    turn = [
        ("system", "You answer questions about the sea."),
        ("user", "Why is the sea salty? " * 9),
    ]
    reply = (
        "assistant",
        "Rivers carry dissolved minerals to it, and evaporation leaves them. " * 5,
    )
    now = hasher.key(chat(*turn), ENC)
    later = hasher.key(chat(*turn, reply, ("user", "And why are lakes not?")), ENC)
    assert len(now.hashes) >= 3
    assert later.hashes[: len(now.hashes)] == now.hashes
    assert len(later.hashes) > len(now.hashes)
    assert later.anchor == now.anchor
    # The opening is this first turn, in both: what a backend holds beyond it is history.
    assert later.opening == now.opening == now.tokens < later.tokens


def test_anchor_tells_conversations_apart_despite_a_shared_system_prompt(
    hasher: PrefixHasher,
) -> None:
    system = ("system", "You are a helpful assistant. " * 30)
    one = hasher.key(chat(system, ("user", "What is a tide?")), ENC)
    two = hasher.key(chat(system, ("user", "What is a wave?")), ENC)
    assert one.hashes[:10] == two.hashes[:10]
    assert one.anchor != two.anchor


def test_roles_and_message_fields_are_part_of_the_prompt(hasher: PrefixHasher) -> None:
    text = "The same words, long enough to fill a few blocks of tokens. " * 4
    user = hasher.key(chat(("user", text)), ENC)
    system = hasher.key(chat(("system", text)), ENC)
    named = hasher.key(
        Request(
            endpoint="chat",
            model="m",
            body={"messages": [{"role": "user", "content": text, "name": "ann"}]},
        ),
        ENC,
    )
    assert user.hashes[0] != system.hashes[0]
    assert user.hashes[0] != named.hashes[0]


def test_tools_precede_the_messages(hasher: PrefixHasher) -> None:
    msgs = [("user", "Weather in Oslo? " * 10)]
    tool = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    assert (
        hasher.key(chat(*msgs), ENC).hashes[0] != hasher.key(chat(*msgs, tools=tool), ENC).hashes[0]
    )


def test_text_parts_equal_plain_content_and_images_are_not_tokenized(hasher: PrefixHasher) -> None:
    text = "Describe what you see in the picture below, please. " * 3
    plain = hasher.key(chat(("user", text)), ENC)
    parts = [{"type": "text", "text": text}]
    as_parts = hasher.key(
        Request(
            endpoint="chat", model="m", body={"messages": [{"role": "user", "content": parts}]}
        ),
        ENC,
    )
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "QUJD" * 50_000}}
    with_image = hasher.key(
        Request(
            endpoint="chat",
            model="m",
            body={"messages": [{"role": "user", "content": [*parts, image]}]},
        ),
        ENC,
    )
    assert as_parts == plain
    assert with_image.hashes[: len(plain.hashes)] == plain.hashes
    assert with_image.tokens < plain.tokens + 50


def test_completion_prompt_forms(hasher: PrefixHasher) -> None:
    text = "Once upon a time there was a gateway that hashed prompts. " * 3
    single = hasher.key(completion(text), ENC)
    assert hasher.key(completion([text, "another prompt"]), ENC) == single
    assert single.tokens == hasher.count_tokens(text, ENC)
    ids = hasher.key(completion([list(range(32)), [1, 2]]), ENC)
    assert ids == hasher.key(completion(list(range(32))), ENC)
    assert hasher.key(completion(None), ENC).tokens == 0


def test_embeddings_input_is_hashed_like_a_prompt(hasher: PrefixHasher) -> None:
    text = "An embedding input of some length, repeated. " * 3
    emb = hasher.key(Request(endpoint="embeddings", model="m", body={"input": text}), ENC)
    assert emb == hasher.key(completion(text), ENC)


def test_count_tokens(hasher: PrefixHasher) -> None:
    assert hasher.count_tokens("hello world", ENC) == 2
    assert hasher.count_tokens("", ENC) == 0
    # Special-token text in user content is ordinary text, never an error.
    assert hasher.count_tokens("<|endoftext|>", ENC) > 1


def test_cl100k_base_loads_offline_and_unknown_encodings_fail_clearly() -> None:
    assert load_encoding("cl100k_base").encode_ordinary("hello world") == [15339, 1917]
    with pytest.raises(SettingsError, match="no_such_encoding"):
        load_encoding("no_such_encoding")


def test_long_prompts_sharing_a_document_share_its_blocks(hasher: PrefixHasher) -> None:
    doc = "".join(f"Paragraph {i}: the tide rises and falls twice a day.\n" for i in range(200))
    doc += "Question: " + "to be answered briefly and exactly, please. " * 5
    one = hasher.key(completion(doc + "Question: when is high tide?"), ENC)
    two = hasher.key(completion(doc + "Question: what moves the tides, and how strongly?"), ENC)
    whole_doc_blocks = hasher.count_tokens(doc, ENC) // 16
    both = min(len(one.hashes), len(two.hashes))
    shared = next((i for i in range(both) if one.hashes[i] != two.hashes[i]), both)
    assert shared >= whole_doc_blocks - 1
    assert one.hashes != two.hashes


def test_pieces_of_a_prefix_are_a_prefix_of_the_pieces() -> None:
    text = "".join(f"line {i} " * (i % 7 + 1) + "\n" for i in range(2000))
    whole = pieces(text)
    assert "".join(whole) == text
    assert len(whole) > 5
    assert all(len(p) >= PIECE_CHARS for p in whole[:-1])
    for cut in (5000, 9001, len(text) - 1):
        part = pieces(text[:cut])
        assert part[:-1] == whole[: len(part) - 1]
    assert pieces("no newline " * 1000) == ["no newline " * 1000]


def test_reply_key_is_the_next_turns_prefix(hasher: PrefixHasher) -> None:
    turn = chat(("system", "Be brief."), ("user", "Explain tides to a child."))
    reply = "The moon pulls on the sea, so the water rises and falls. " * 12
    now = hasher.key(turn, ENC)
    after = hasher.reply_key(turn, ENC, reply, now)
    assert after is not None
    assert after.hashes[: len(now.hashes)] == now.hashes
    assert after.anchor == now.anchor
    # A client resends the reply as an SDK message object, empty fields and all.
    sdk_reply: dict[str, Any] = {
        "role": "assistant",
        "content": reply,
        "refusal": None,
        "tool_calls": [],
    }
    messages = [*turn.body["messages"], sdk_reply, {"role": "user", "content": "Why twice?"}]
    later = hasher.key(Request(endpoint="chat", model="m", body={"messages": messages}), ENC)
    assert later.hashes[: len(after.hashes)] == after.hashes
    assert len(after.hashes) > 3 * len(now.hashes)
    assert hasher.reply_key(turn, ENC, "", now) is None
    prose = completion("Once upon a time")
    assert hasher.reply_key(prose, ENC, "there was", hasher.key(prose, ENC)) is None


@pytest.mark.parametrize("reply", ["ok", "Tides. " * 3, "The moon pulls on the sea. " * 40])
@pytest.mark.parametrize("history", [0, 1, 7])
def test_reply_key_equals_the_prompt_and_reply_hashed_whole(
    hasher: PrefixHasher, reply: str, history: int
) -> None:
    """Continued from the prompt's tail, whatever part of a block the prompt ends in and
    however many blocks the reply fills; cut at max_blocks as a whole prompt is."""
    turns = [("system", "Be brief. " * 9)]
    for i in range(history):
        turns += [("user", f"Question {i} about tides?" * (i + 1)), ("assistant", "Because. " * i)]
    turn = chat(*turns, ("user", "And why twice a day?"))
    whole = chat(*turns, ("user", "And why twice a day?"), ("assistant", reply))
    for max_blocks in (4096, 6):
        h = PrefixHasher(PrefixSettings(max_blocks=max_blocks))
        learned = h.reply_key(turn, ENC, reply, h.key(turn, ENC))
        assert learned is not None
        expected = h.key(whole, ENC)
        assert (learned.hashes, learned.tokens) == (expected.hashes, expected.tokens)
        assert len(learned.hashes) <= max_blocks


def test_block_hashes_chain_on_from_the_parent_they_are_given() -> None:
    tokens = bytes(range(256)) * 3  # 12 blocks of 16 tokens (4 bytes each)
    whole = block_hashes(tokens, 16, 100)
    assert len(whole) == 12
    assert block_hashes(tokens[5 * 64 :], 16, 100, whole[4]) == whole[5:]
    assert block_hashes(tokens, 16, 8) == whole[:8]  # at most max_blocks
    assert block_hashes(tokens[:100], 16, 100) == whole[:1]  # full blocks only


def test_piece_cache_stays_within_its_byte_budget() -> None:
    cache = PieceCache(budget=64 * 1024)
    for i in range(2000):
        cache.put((ENC, f"piece {i} " + "x" * 500), b"\0" * 512)
    assert 0 < cache.used <= cache.budget
    assert len(cache) < 2000
    assert cache.get((ENC, "piece 1999 " + "x" * 500)) is not None  # the newest stay
    assert cache.get((ENC, "piece 0 " + "x" * 500)) is None  # the oldest went first


def test_piece_cache_skips_a_piece_too_big_to_share_the_budget() -> None:
    cache = PieceCache(budget=64 * 1024)
    cache.put((ENC, "small"), b"\0" * 8)
    cache.put((ENC, "y" * 20_000), b"\0" * 20_000)
    assert len(cache) == 1
    assert cache.get((ENC, "small")) is not None


def test_hasher_keeps_its_token_cache_within_the_setting() -> None:
    hasher = PrefixHasher(PrefixSettings(token_cache_mb=0.25))
    for i in range(400):
        hasher.key(chat(("user", f"question {i}: " + "tides and currents " * 60)), ENC)
    assert hasher._pieces.used <= 0.25 * 2**20
    assert len(hasher._pieces) < 400


SYSTEM = "You answer questions about the hosting plans. " * 20


def test_a_responses_call_hashes_as_the_chat_call_with_its_conversation(
    hasher: PrefixHasher,
) -> None:
    """instructions + input items are the prompt, as vLLM renders them with chat's template,
    so the two APIs share cached prefixes; the reply's key is the next turn's prefix."""
    conversation = chat(("system", SYSTEM), ("user", "Which plan has backups?"))
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Which plan has backups?"}]}
    ]
    responses = Request(endpoint="responses", model="m",
                        body={"instructions": SYSTEM, "input": items})  # fmt: skip
    key = hasher.key(responses, "cl100k_base")
    assert key == hasher.key(conversation, "cl100k_base")
    question = "Which plan has backups?"
    as_text = Request(
        endpoint="responses", model="m", body={"instructions": SYSTEM, "input": question}
    )
    assert hasher.key(as_text, "cl100k_base") == key
    reply = "The business plan keeps nightly backups for thirty days. " * 4
    turn2 = Request(endpoint="responses", model="m", body={"instructions": SYSTEM, "input": [
        *items, {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": reply, "annotations": []}]},
        {"role": "user", "content": "And the cheapest?"}]})  # fmt: skip
    learned = hasher.reply_key(responses, "cl100k_base", reply, key)
    assert learned is not None
    assert hasher.key(turn2, "cl100k_base").hashes[: len(learned.hashes)] == learned.hashes
