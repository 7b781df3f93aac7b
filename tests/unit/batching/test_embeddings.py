import orjson
import pytest

from gateway.batching.embeddings import (
    group_key,
    largest_remainder,
    split_response,
    text_inputs,
    weight,
)
from gateway.errors import BadGateway


@pytest.mark.parametrize(
    ("total", "weights", "parts"),
    [
        (10, [1, 1, 1], [4, 3, 3]),
        (10, [1, 2, 2], [2, 4, 4]),
        (7, [5, 0, 5], [4, 0, 3]),
        (3, [0, 0], [2, 1]),
        (0, [3, 4], [0, 0]),
        (100, [33, 33, 34], [33, 33, 34]),
        (5, [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]),
    ],
)
def test_largest_remainder_splits_exactly(total: int, weights: list[int], parts: list[int]) -> None:
    got = largest_remainder(total, weights)
    assert got == parts
    assert sum(got) == total


def test_largest_remainder_gives_the_extra_to_the_largest_remainders() -> None:
    # 11 * (2, 3, 5) / 10 = 2.2, 3.3, 5.5: the floors sum to 10, the one left goes to 5.5.
    assert largest_remainder(11, [2, 3, 5]) == [2, 3, 6]


def upstream_answer(n: int, prompt_tokens: int) -> bytes:
    data = [{"index": i, "object": "embedding", "embedding": [float(i)]} for i in range(n)]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0}
    return orjson.dumps(
        {"id": "embd-1", "object": "list", "model": "m", "data": data[::-1], "usage": usage}
    )


def test_split_gives_each_caller_its_vectors_indexed_from_zero() -> None:
    parts = [orjson.loads(p) for p in split_response(upstream_answer(5, 50), [2, 1, 2], [1, 1, 3])]
    assert [[d["embedding"] for d in p["data"]] for p in parts] == [
        [[0.0], [1.0]],
        [[2.0]],
        [[3.0], [4.0]],
    ]
    assert [[d["index"] for d in p["data"]] for p in parts] == [[0, 1], [0], [0, 1]]
    assert [p["usage"]["prompt_tokens"] for p in parts] == [10, 10, 30]
    assert [p["usage"]["total_tokens"] for p in parts] == [10, 10, 30]
    assert all(p["id"] == "embd-1" and p["object"] == "list" for p in parts)


def test_split_refuses_an_answer_that_does_not_match_the_inputs() -> None:
    with pytest.raises(BadGateway):
        split_response(upstream_answer(3, 10), [2, 2], [1, 1])
    with pytest.raises(BadGateway):
        split_response(b"not json", [1], [1])


def test_text_inputs_and_weights() -> None:
    assert text_inputs("abc") == ["abc"]
    assert text_inputs(["a", "bc"]) == ["a", "bc"]
    assert text_inputs([1, 2, 3]) is None
    assert text_inputs([[1], [2]]) is None
    assert text_inputs([]) is None
    assert weight(["a", "bc"]) == 3


def test_calls_group_by_everything_but_input_and_user() -> None:
    a = {"model": "m", "input": "x", "user": "u1", "encoding_format": "float"}
    b = {"model": "m", "input": ["y", "z"], "user": "u2", "encoding_format": "float"}
    assert group_key(a) == group_key(b)
    assert group_key(a) != group_key({**a, "encoding_format": "base64"})
    assert group_key(a) != group_key({**a, "model": "other"})
