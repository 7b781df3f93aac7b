from gateway.sim import tokenizer


def test_same_text_same_tokens_and_split_round_trips() -> None:
    text = "Hello, world!  The cache\tholds 16-token blocks."
    assert tokenizer.encode(text) == tokenizer.encode(text)
    assert b"".join(tokenizer.split(text)) == text.encode()
    assert len(tokenizer.encode(text)) == len(tokenizer.split(text))
    assert tokenizer.encode("a b") != tokenizer.encode("a c")


def test_non_ascii_text_falls_back_to_bytes() -> None:
    assert len(tokenizer.encode("é")) == 2
    assert b"".join(tokenizer.split("naïve café")) == "naïve café".encode()


def test_generated_tokens_tokenize_back_to_themselves() -> None:
    out = tokenizer.generated(seed=42, count=50)
    assert out == tokenizer.generated(seed=42, count=50)
    assert tokenizer.encode(tokenizer.detokenize(out)) == [tokenizer.GENERATED_IDS[i] for i in out]


def test_next_turn_prompt_extends_previous_prompt_and_answer() -> None:
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there."}]
    prompt = tokenizer.encode(tokenizer.render_chat(first))
    answer = tokenizer.generated(seed=7, count=20)
    second = [
        *first,
        {"role": "assistant", "content": tokenizer.detokenize(answer)},
        {"role": "user", "content": "And then?"},
    ]
    next_prompt = tokenizer.encode(tokenizer.render_chat(second))
    expected_prefix = prompt + [tokenizer.GENERATED_IDS[i] for i in answer]
    assert next_prompt[: len(expected_prefix)] == expected_prefix
    assert len(next_prompt) > len(expected_prefix)


def test_content_parts_render_like_a_string() -> None:
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}],
        }
    ]
    plain = [{"role": "user", "content": "one two"}]
    assert tokenizer.render_chat(parts) == tokenizer.render_chat(plain)
