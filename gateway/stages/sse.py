"""Scan a relayed SSE stream: pass its events through and pick out what the end of the call
needs (the usage event and the reply's text), and when the first token and the end came.

Pure: it sees bytes and says what it found; the pipeline's end decides what the call
keeps of it.

A chat or completions stream's first byte comes with its first token (vLLM sends the
role-only opening chunk with it); a Responses stream opens with ``response.created`` and
``response.in_progress`` as soon as the request is accepted, before prefill, so its time
to first token is that of the first event that carries output (``token_seen``).
"""

from __future__ import annotations

import orjson

from gateway.flow import Usage
from gateway.stages import usage as usage_stage


class EventScanner:
    """Splits an SSE byte stream into events and picks out the usage event.

    Events are passed through as the bytes that came. Usage comes in the last event
    before ``[DONE]`` (OpenAI's protocol: a chat or completions stream's usage chunk, a
    Responses stream's ``response.completed``; usage that vLLM reports on every chunk is
    cumulative and ends there too), so only the last event of each piece read is looked
    at, and decoded only if it mentions usage: looking through every event for it cost a
    scan of the whole stream, as much as the relay's own reading. One the client did not
    ask for (``choices: []`` plus usage) is dropped.
    """

    RAW_KEPT = 32 * 1024
    """Bytes of delivered events held before they are reduced to their text: an event is
    ~250 bytes for a token or two of text, so a long stream held as events would cost
    about a hundred times its reply for as long as it is open."""

    def __init__(
        self, strip_usage: bool, watch_tokens: bool = False, keep_text: bool = True
    ) -> None:
        self.strip_usage = strip_usage
        self.keep_text = keep_text
        """The whole reply's text is wanted (to learn the next turn's prefix): events are
        reduced to text as they pile up. Otherwise they pass unread, and only the last
        ``RAW_KEPT`` bytes or fewer of them stay, to estimate the reply from should its
        usage never come: reading every event's text costs more than relaying it (a scan
        of every byte in Python's regular expressions, against a copy in the kernel)."""
        self.token_seen = not watch_tokens
        """An event carrying output has passed (only looked for when ``watch_tokens``)."""
        self.ended = False
        """The stream's last event has passed: ``[DONE]``, or a Responses stream's end."""
        self.usage: Usage | None = None
        """The last usage the stream carried; None while it carried none."""
        self.delivered: list[bytes] = []
        """Events passed to the client not yet reduced to text (see ``reply``), as the
        pieces they were passed in."""
        self._held = 0
        self._bound = self.RAW_KEPT
        """Held bytes past which they are reduced next (``_reduce``)."""
        self._passed = 0
        """Bytes of events passed unread and forgotten (``keep_text`` off)."""
        self._text: list[str] = []
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        """The complete events so far, as the client gets them."""
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\n\n") + 2
        if end < 2:
            self._buf = buf
            return b""
        out, self._buf = buf[:end], buf[end:]
        if not self.token_seen:
            self.token_seen = any(map(carries_token, out.split(b"\n\n")))
        out = self._last_events(out)
        self.delivered.append(out)
        self._held += len(out)
        if self._held > self._bound:
            self._reduce()
        return out

    def reply(self) -> str:
        """The text delivered so far: to count tokens if usage never arrives, and to learn
        the next turn's prefix. Without ``keep_text``, only that of the last events kept
        (``reply_share`` of them)."""
        return "".join(self._text) + self._delivered_text()

    @property
    def reply_share(self) -> float:
        """The share of the events delivered whose text ``reply`` holds (by their bytes)."""
        return self._held / (self._held + self._passed) if self._passed else 1.0

    def _reduce(self) -> None:
        """Bound what an open stream holds: its events so far as their text, or without
        ``keep_text`` only the last ``RAW_KEPT / 2`` bytes or so of whole events."""
        if self.keep_text:
            self._text.append(self._delivered_text())
            self.delivered.clear()
            self._held = 0
            return
        held = b"".join(self.delivered)  # down to half: copied once per half held
        cut = usage_stage.event_start(held, len(held) - self.RAW_KEPT // 2)
        self.delivered = [held[cut:]]
        self._passed += cut
        self._held -= cut
        # An event longer than that (nothing to cut before it) is not copied again for
        # every event after it: the next try waits for another half.
        self._bound = max(self.RAW_KEPT, self._held + self.RAW_KEPT // 2)

    def tail(self) -> bytes:
        """Whatever followed the last complete event (normally nothing)."""
        rest, self._buf = self._buf, b""
        return rest

    def _delivered_text(self) -> str:
        return usage_stage.stream_text(b"".join(self.delivered))

    def _last_events(self, events: bytes) -> bytes:
        """The events (each ending in a blank line) less a usage event nobody asked for,
        noting the stream's end: only the last events are looked at, back past comments
        and ``[DONE]`` to the last that carries data."""
        end = len(events) - 2
        while end > 0:
            start = usage_stage.event_start(events, end)
            if events.startswith(b"data: [DONE]\n", start):
                self.ended = True
            elif not events.startswith(b":", start):
                break
            end = start - 2
        else:
            return events
        self.ended = self.ended or events.startswith(RESPONSE_ENDS, start)
        if events.find(b'"usage"', start, end) < 0 or self._keep(events[start:end]):
            return events
        return events[:start] + events[end + 2 :]

    def _keep(self, event: bytes) -> bool:
        if b'"usage":' not in event and b'"usage" :' not in event:
            return True
        try:
            data = orjson.loads(event.partition(b"data:")[2])
        except orjson.JSONDecodeError:
            return True
        found = usage_stage.event_usage(data)
        if found is None:
            return True
        self.usage = found
        return not (self.strip_usage and not data.get("choices"))


RESPONSE_ENDS = (b"event: response.completed", b"event: response.incomplete",
                 b"event: response.failed")  # fmt: skip
RESPONSE_OUTPUT = frozenset({"response.output_item.added", "response.completed",
                             "response.incomplete"})  # fmt: skip
"""Responses API events that show output was generated; so does any ``*.delta`` event.
``response.created`` and ``.in_progress`` come before prefill."""


def carries_token(event: bytes) -> bool:
    """The event shows the backend generated output: the prompt is prefilled."""
    payload = event.partition(b"data:")[2].strip()
    if payload == b"[DONE]":
        return True
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(data, dict):
        return False
    if "error" in data:
        return False
    kind = data.get("type")
    if isinstance(kind, str) and kind.startswith("response."):  # a Responses API event
        return kind in RESPONSE_OUTPUT or kind.endswith(".delta")
    if data.get("usage"):
        return True
    for choice in data.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        produced = (
            any(delta.get(f) for f in ("content", "tool_calls", "reasoning_content", "reasoning"))
            if isinstance(delta, dict)
            else bool(choice.get("text"))
        )
        if produced or choice.get("finish_reason"):
            return True
    return False
