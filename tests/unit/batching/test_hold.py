import orjson

from gateway.batching.hold import FirstToken, PrefixHold, carries_token
from gateway.flow import Call, PrefixKey, Request
from gateway.settings import BatchingSettings


def event(data: object) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def chunk(delta: dict | None = None, text: str | None = None, finish: str | None = None) -> bytes:
    choice: dict = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    if text is not None:
        choice["text"] = text
    return event({"object": "chunk", "choices": [choice]})


def test_a_role_only_opening_is_not_a_token() -> None:
    assert not carries_token(chunk({"role": "assistant", "content": ""}).strip())
    assert carries_token(chunk({"content": " the"}).strip())
    assert carries_token(chunk({"tool_calls": [{"index": 0}]}).strip())
    assert carries_token(chunk(text=" the").strip())
    assert carries_token(chunk({}, finish="length").strip())
    assert carries_token(b"data: [DONE]")
    assert not carries_token(event({"error": {"message": "x"}}).strip())


def test_first_token_is_found_across_chunk_boundaries() -> None:
    finder = FirstToken()
    stream = chunk({"role": "assistant", "content": ""}) + chunk({"content": " word"})
    cut = len(stream) - 10
    assert not finder.feed(stream[:cut])
    assert finder.feed(stream[cut:])


def call_with_prefix(hashes: list[int], block_size: int = 16) -> Call:
    call = Call(id="c", path="/v1/chat/completions")
    call.request = Request("chat", "m", {})
    call.prefix = PrefixKey(tokens=len(hashes) * block_size, hashes=hashes, block_size=block_size)
    return call


def test_the_hold_key_names_the_first_hold_min_tokens() -> None:
    hold = PrefixHold(BatchingSettings(hold_min_tokens=40))  # 3 blocks of 16
    assert hold.key(call_with_prefix([1, 2])) is None
    assert hold.key(call_with_prefix([1, 2, 3])) == ("m", 3)
    assert hold.key(call_with_prefix([1, 2, 3, 4, 5])) == ("m", 3)
    assert hold.key(call_with_prefix([1, 2, 9, 4])) != hold.key(call_with_prefix([1, 2, 3, 4]))
