"""Price a finished call: split its tokens by kind and cost each kind exactly.

OpenAI's convention: prompt_tokens includes the cached (cache read) tokens, and here also
the cache-write tokens a backend may report, so standard input is what remains. Every part
is rounded to the ledger's fixed scale (1e-10 USD) on its own, half to even, and the total
is the sum of the rounded parts, so totals over any set of rows add up to the last digit.
All of it is integer arithmetic on prices in 1e-10 USD units per million tokens: exact,
and several times cheaper per call than the same sums in Decimal.
"""

from __future__ import annotations

from gateway.flow import Cost, Usage
from gateway.ledger.prices import PriceVersion

PER_TOKENS = 1_000_000
"""Prices are quoted per million tokens."""
_HALF = PER_TOKENS // 2


def standard_input_tokens(usage: Usage) -> int:
    """Prompt tokens billed at the standard input price (never negative)."""
    return max(usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens, 0)


def _part(tokens: int, units_per_million: int) -> int:
    """tokens * price / 1e6 rounded half to even: what Decimal.quantize does at that scale."""
    q, r = divmod(tokens * units_per_million, PER_TOKENS)
    return q + 1 if r > _HALF or (r == _HALF and q & 1) else q


def price_usage(usage: Usage | None, price: PriceVersion | None) -> Cost:
    """The call's cost under ``price``; zero (and no price id) when the model has no price."""
    if usage is None or price is None:
        return Cost(price_id=price.id if price else None)
    p_input, p_cached, p_write, p_output = price.units
    cost_input = _part(standard_input_tokens(usage), p_input)
    cached = _part(usage.cached_tokens, p_cached)
    write = _part(usage.cache_write_tokens, p_write)
    output = _part(usage.completion_tokens, p_output)
    return Cost(
        input=cost_input,
        cached_input=cached,
        cache_write=write,
        output=output,
        total=cost_input + cached + write + output,
        without_cache=_part(usage.prompt_tokens, p_input) + output,
        price_id=price.id,
    )
