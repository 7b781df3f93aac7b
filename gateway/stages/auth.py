"""Who is calling, and may they use this model.

A model the key may not use answers exactly as a model that does not exist (404
model_not_found, OpenAI's answer for models a key cannot see), so a key learns nothing
about models outside its list.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping

from gateway.errors import ModelNotFound
from gateway.flow import Principal
from gateway.keys import KeyRing


def known(headers: Mapping[str, str], keys: KeyRing) -> Principal | None:
    """The principal, when the key cache can tell without a lookup (nearly every call:
    no coroutine to build and await); None when it takes ``authenticate``."""
    return keys.known(headers.get("authorization"))


def authenticate(headers: Mapping[str, str], keys: KeyRing) -> Awaitable[Principal]:
    """The principal for ``Authorization: Bearer gk-...``; 401 invalid_api_key otherwise.
    (The keyring's coroutine itself, not one wrapped in another.)"""
    return keys.authenticate(headers.get("authorization"))


def authorize_model(principal: Principal, model: str) -> None:
    if principal.models is not None and model not in principal.models:
        raise ModelNotFound(
            f"The model `{model}` does not exist or you do not have access to it.", param="model"
        )
