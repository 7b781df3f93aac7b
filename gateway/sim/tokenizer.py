"""A cheap, deterministic tokenizer and chat template.

Working on the UTF-8 bytes, a token is an ASCII word with at most one leading space, or
any other single byte (punctuation, whitespace, each byte of a non-ASCII character); its
id is the CRC-32 of its bytes. The same text always gives
the same ids, in every process, and concatenating texts concatenates their tokens at the
boundaries the chat template produces. That is what lets a conversation's next turn
(history + the assistant's answer) begin with exactly the previous prompt's tokens
followed by the generated ones, so it hits the blocks the previous turn left cached.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_TOKEN = re.compile(rb" ?\w+|[^\w\s]|\s")

# Generated text is drawn from this list; each word is one token (" word").
_WORDS = str.split(
    "the of and to in is that it for on was with as at by this be from or have an are "
    "not but what all were when we there can more if will one about up out has them "
    "some would so into time only new could like than first been other its way who "
    "now people made just over also after back use two how our work well even want "
    "because any these give day most us cache block token model prefix router"
)
GENERATED_TOKENS = tuple(f" {w}" for w in _WORDS)
GENERATED_IDS = tuple(zlib.crc32(t.encode()) for t in GENERATED_TOKENS)


def split(text: str) -> list[bytes]:
    """The tokens of text, as bytes; joined, they give the text's UTF-8 back."""
    return _TOKEN.findall(text.encode())


def encode(text: str) -> list[int]:
    return [zlib.crc32(t) for t in _TOKEN.findall(text.encode())]


def generated_at(seed: int, position: int) -> int:
    """Index into GENERATED_TOKENS of the answer's token at position, for this seed."""
    return hash((seed, position)) % len(GENERATED_TOKENS)


def generated(seed: int, count: int) -> list[int]:
    return [generated_at(seed, i) for i in range(count)]


def content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    raise TypeError("content must be a string or a list of content parts")


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """Render messages as `<|role|>\\ncontent<|end|>\\n`, then `<|assistant|>\\n`.

    The generation prompt is exactly the prefix of a rendered assistant message, so the
    next turn's prompt extends this one by the answer (see the module docstring).
    """
    parts: list[str] = []
    for m in messages:
        role = m.get("role")
        if not isinstance(role, str):
            raise TypeError("every message needs a string role")
        parts.append(f"<|{role}|>\n{content_text(m.get('content'))}<|end|>\n")
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


def detokenize(indexes: Iterable[int]) -> str:
    return "".join(GENERATED_TOKENS[i] for i in indexes)
