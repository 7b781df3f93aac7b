"""Key material: a new secret, its display prefix, its stored hash.

A secret is ``gk-`` and 32 random bytes (url-safe base64). Only its HMAC-SHA256 under
the server-side pepper is stored, so a leaked table is useless without the pepper; with
256 random bits no pepper is needed against guessing, which is why a plain fast hash
(not a password KDF) is right here; it is computed only when the key cache misses.

The key cache is indexed by the Authorization header itself, not by a hash of it. Until
2026-11-30 it was a BLAKE2b tag of the header, so that the cache would hold no secret; but
the process holds every presented secret anyway (each request's header is a string in
memory, and Python does not wipe the memory it frees), so a dump of it shows recent keys
with or without the tag. The tag cost a tiny call about 2 us of its ~300 (0.6% of its CPU,
measured against the tagged code in one run): in a hot loop BLAKE2b takes 0.3 us, but in
the gateway the rest of the call has pushed its 6 KB of compression code and its state out
of the CPU's caches. A dict of header strings costs a hash of the string: code that every
dict lookup runs. The database still stores only the HMAC; no secret reaches a log, a
metric, an error or a report.
"""

from __future__ import annotations

import hmac
import secrets

SCHEME = "gk-"
PREFIX_CHARS = 8
"""Characters of the secret after ``gk-`` shown in listings (48 of 256 bits)."""


def new_secret() -> str:
    return SCHEME + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """The public, non-secret id that logs, the ledger and reports use."""
    return "key_" + secrets.token_hex(8)


def display_prefix(secret: str) -> str:
    return secret[: len(SCHEME) + PREFIX_CHARS]


def hash_secret(secret: str, pepper: str) -> str:
    return hmac.digest(pepper.encode(), secret.encode(), "sha256").hex()  # the C fast path


def looks_like_key(token: str) -> bool:
    """Cheap shape check, so garbage never reaches the cache or the database."""
    return token.startswith(SCHEME) and 20 <= len(token) <= 200
