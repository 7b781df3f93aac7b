"""Scan a relayed SSE stream: pass its events through and pick out what the end of the call
needs (the usage event and the reply's text).

Pure: it sees bytes and says what it found; the pipeline's end decides what the call
keeps of it.
"""

from __future__ import annotations

import orjson

from gateway.flow import Usage
from gateway.stages import usage as usage_stage


class EventScanner:
    """Splits an SSE byte stream into events and picks out the usage event.

    Events are passed through as bytes; only an event carrying a usage object is decoded.
    One the client did not ask for (``choices: []`` plus usage) is dropped.
    """

    RAW_KEPT = 32 * 1024
    """Bytes of delivered events held before they are reduced to their text: an event is
    ~250 bytes for a token or two of text, so a long stream held as events cost ~100x
    its reply (a 4,000-token stream ~1 MB for as long as it was open)."""

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.usage: Usage | None = None
        """The last usage the stream carried; None while it carried none."""
        self.delivered: list[bytes] = []
        """Events passed to the client not yet reduced to text (see ``reply``)."""
        self._held = 0
        self._text: list[str] = []
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        """The complete events so far, as the client gets them."""
        self._buf += data
        if b"\n\n" not in self._buf:
            return b""
        *events, self._buf = self._buf.split(b"\n\n")
        kept = [e for e in events if self._keep(e)]
        self.delivered.extend(kept)
        self._held += len(data)
        if self._held > self.RAW_KEPT:
            self._text.append(usage_stage.delivered_text(self.delivered))
            self.delivered.clear()
            self._held = 0
        return b"".join(e + b"\n\n" for e in kept)

    def reply(self) -> str:
        """The text delivered so far: to count tokens if usage never arrives, and to learn
        the next turn's prefix."""
        return "".join(self._text) + usage_stage.delivered_text(self.delivered)

    def tail(self) -> bytes:
        """Whatever followed the last complete event (normally nothing)."""
        rest, self._buf = self._buf, b""
        return rest

    def _keep(self, event: bytes) -> bool:
        if b'"usage":' not in event and b'"usage" :' not in event:
            return True
        try:
            data = orjson.loads(event.partition(b"data:")[2])
        except orjson.JSONDecodeError:
            return True
        found = usage_stage.from_usage(data.get("usage")) if isinstance(data, dict) else None
        if found is None:
            return True
        self.usage = found
        return not (self.strip_usage and not data.get("choices"))
