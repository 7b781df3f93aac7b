"""Key material: a new secret, its display prefix, its stored hash.

A secret is ``gk-`` and 32 random bytes (url-safe base64). Only its HMAC-SHA256 under
the server-side pepper is stored, so a leaked table is useless without the pepper; with
256 random bits no pepper is needed against guessing, which is why a plain fast hash
(not a password KDF) is right here; it is computed only when the key cache misses.

The key cache is indexed by the Authorization header itself, not by a hash of it: the
process holds every presented secret anyway (each request's header is a string in
memory), so a tag would hide nothing from a memory dump and cost every call a hash. The
database stores only the HMAC; no secret reaches a log, a metric, an error or a report.

An app's end user (`safety_identifier` or `user`) reaches the ledger the same way: only
its HMAC under the pepper, so an e-mail address used as an identifier is never stored and
cannot be recovered from the ledger by guessing without the pepper.
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


END_USER_CHARS = 32
"""Hex characters of an end user's hash kept on the ledger row (128 bits)."""
END_USER_DOMAIN = b"gateway end user\x00"
"""Prefixed to the pepper: end users are hashed under a key of their own, so an end
user's name never hashes to what a key secret of the same text would."""


def end_user_key(pepper: str) -> bytes:
    return END_USER_DOMAIN + pepper.encode()


def hash_end_user(end_user: str, key: bytes) -> str:
    """The ledger's name for an end user: HMAC-SHA256 under ``end_user_key(pepper)``."""
    return hmac.digest(key, end_user.encode(), "sha256").hex()[:END_USER_CHARS]


def looks_like_key(token: str) -> bool:
    """Cheap shape check, so garbage never reaches the cache or the database."""
    return token.startswith(SCHEME) and 20 <= len(token) <= 200
