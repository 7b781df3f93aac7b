"""API keys and teams: issued by the admin API or `gateway keys`, checked on every call."""

from gateway.keys.service import KeyRing

__all__ = ["KeyRing"]
