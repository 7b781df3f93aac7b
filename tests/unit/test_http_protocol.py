import asyncio

from gateway.http_protocol import CoalescingTransport


class Recorded(asyncio.Transport):
    """A transport that keeps what is sent, one entry per send."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 8080) if name == "sockname" else default


async def test_writes_of_one_turn_leave_as_one_send_in_order() -> None:
    inner = Recorded()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"body")
    assert inner.sent == []
    await asyncio.sleep(0)
    assert inner.sent == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    transport.write(b"more")
    await asyncio.sleep(0)
    assert inner.sent[1:] == [b"more"]


async def test_close_sends_what_is_pending_first_and_a_closed_transport_gets_nothing() -> None:
    inner = Recorded()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"last words")
    transport.close()
    assert inner.sent == [b"last words"]
    assert inner.closed
    transport.write(b"after close")
    await asyncio.sleep(0)
    assert inner.sent == [b"last words"]


async def test_everything_else_is_the_transports_own() -> None:
    inner = Recorded()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    assert transport.get_extra_info("sockname") == ("127.0.0.1", 8080)
    assert transport.is_closing() is False


async def test_write_now_sends_at_once_after_what_is_pending() -> None:
    inner = Recorded()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write_now(b"piece")
    assert inner.sent == [b"piece"]  # not held to the turn's end
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write_now(b"first")
    assert inner.sent[1:] == [b"HTTP/1.1 200 OK\r\n\r\nfirst"]  # in order, one send
    await asyncio.sleep(0)
    assert len(inner.sent) == 2  # the turn's end finds nothing left to send
    transport.close()
    transport.write_now(b"after close")
    assert len(inner.sent) == 2
