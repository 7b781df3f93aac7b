"""Price a finished call: split its tokens by kind and cost each kind exactly.

OpenAI's convention: prompt_tokens includes the cached (cache read) tokens, and here also
the cache-write tokens a backend may report, so standard input is what remains. Every part
is rounded to the ledger's fixed scale on its own and the total is the sum of the rounded
parts, so totals over any set of rows add up to the last digit.
"""

from __future__ import annotations

from decimal import Decimal

from gateway.flow import Cost, Usage
from gateway.ledger.models import quantize
from gateway.ledger.prices import PriceVersion

PER_TOKENS = Decimal(1_000_000)
"""Prices are quoted per million tokens."""


def standard_input_tokens(usage: Usage) -> int:
    """Prompt tokens billed at the standard input price (never negative)."""
    return max(usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens, 0)


def _part(tokens: int, per_million: Decimal) -> Decimal:
    return quantize(tokens * per_million / PER_TOKENS)


def price_usage(usage: Usage | None, price: PriceVersion | None) -> Cost:
    """The call's cost under ``price``; zero (and no price id) when the model has no price."""
    if usage is None or price is None:
        return Cost(price_id=price.id if price else None)
    cost = Cost(
        input=_part(standard_input_tokens(usage), price.input),
        cached_input=_part(usage.cached_tokens, price.cached_input),
        cache_write=_part(usage.cache_write_tokens, price.cache_write),
        output=_part(usage.completion_tokens, price.output),
        price_id=price.id,
    )
    cost.total = cost.input + cost.cached_input + cost.cache_write + cost.output
    cost.without_cache = _part(usage.prompt_tokens, price.input) + cost.output
    return cost
