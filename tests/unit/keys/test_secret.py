from gateway.keys.secret import (
    display_prefix,
    hash_secret,
    looks_like_key,
    new_key_id,
    new_secret,
)


def test_a_secret_is_gk_and_32_random_bytes() -> None:
    a, b = new_secret(), new_secret()
    assert a.startswith("gk-")
    assert len(a) == 3 + 43  # token_urlsafe(32): 43 base64 characters
    assert a != b
    assert looks_like_key(a)


def test_the_hash_depends_on_the_pepper_and_hides_the_secret() -> None:
    secret = new_secret()
    h = hash_secret(secret, "pepper-1")
    assert h == hash_secret(secret, "pepper-1")
    assert h != hash_secret(secret, "pepper-2")
    assert len(h) == 64
    assert secret[3:] not in h


def test_the_display_prefix_shows_only_the_start() -> None:
    secret = new_secret()
    assert display_prefix(secret) == secret[:11]
    assert new_key_id().startswith("key_")


def test_shapes_that_are_no_key_are_refused_early() -> None:
    assert not looks_like_key("sk-" + "a" * 40)
    assert not looks_like_key("gk-short")
    assert not looks_like_key("gk-" + "a" * 300)
