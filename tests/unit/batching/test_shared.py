"""The shared answer against an in-memory upstream that releases chunks on demand."""

import asyncio

import pytest

from gateway.batching.shared import Listener, SharedAnswer
from gateway.errors import BadGateway
from tests.unit.batching.fakes import FakeUpstream


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def collect(listener: Listener) -> list[bytes]:
    return [c async for c in listener.chunks()]


async def test_a_late_listener_replays_from_the_start_then_follows() -> None:
    up = FakeUpstream()
    ended: list[SharedAnswer] = []
    shared = SharedAnswer(up, on_end=ended.append)
    first = shared.listen()
    assert first is not None
    early = asyncio.create_task(collect(first))
    up.queue.put_nowait(b"a")
    up.queue.put_nowait(b"b")
    await settle()
    late = shared.listen()
    assert late is not None
    late_task = asyncio.create_task(collect(late))
    await settle()
    up.queue.put_nowait(b"c")
    up.queue.put_nowait(None)
    assert b"".join(await early) == b"abc"
    assert await late_task == [b"ab", b"c"]
    await settle()
    assert up.released
    assert not up.closed
    assert ended == [shared]
    assert late.headers["x-backend-instance"] == "b1"


async def test_a_piped_listener_refusing_a_piece_goes_on_where_it_stopped() -> None:
    up = FakeUpstream()
    shared = SharedAnswer(up, on_end=lambda _: None)
    listener = shared.listen()
    assert listener is not None
    got: list[bytes] = []

    def deliver(piece: bytes) -> bool:
        got.append(piece)
        return len(got) > 1  # refuses more after the first piece

    for piece in (b"a", b"b", None):
        up.queue.put_nowait(piece)
    await settle()
    assert await listener.pipe(deliver) is False
    assert await listener.pipe(deliver) is True
    assert got == [b"ab"]  # all that had come, in one piece, delivered once
    listener.close()


async def test_only_the_last_listener_leaving_ends_the_upstream_call() -> None:
    up = FakeUpstream()
    shared = SharedAnswer(up, on_end=lambda _: None)
    one, two = shared.listen(), shared.listen()
    assert one is not None
    assert two is not None
    up.queue.put_nowait(b"a")
    await settle()
    one.close()
    one.close()  # idempotent: still one listener left
    await settle()
    assert not up.closed
    two.close()
    await settle()
    assert up.closed
    assert shared.listen() is None, "an abandoned answer takes no new listeners"


async def test_an_upstream_failure_reaches_every_listener() -> None:
    up = FakeUpstream()
    shared = SharedAnswer(up, on_end=lambda _: None)
    listeners = [shared.listen() for _ in range(3)]
    up.queue.put_nowait(b"partial")
    up.queue.put_nowait(BadGateway("broke"))
    for listener in listeners:
        assert listener is not None
        with pytest.raises(BadGateway):
            await listener.read()
    assert up.closed
