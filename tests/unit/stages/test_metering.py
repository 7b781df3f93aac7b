from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from gateway.flow import Cost, Usage
from gateway.ledger.models import quantize, to_usd
from gateway.ledger.prices import PriceVersion
from gateway.stages.metering import price_usage, standard_input_tokens

PRICE = PriceVersion(
    id=7, model="m", effective_from=datetime(2026, 1, 1, tzinfo=UTC),
    input=Decimal("2.5"), cached_input=Decimal("1.25"), cache_write=Decimal("3.125"),
    output=Decimal("10"), source="config",
)  # fmt: skip


def test_prompt_includes_cached_and_cache_write_tokens() -> None:
    assert standard_input_tokens(Usage(prompt_tokens=100, cached_tokens=60)) == 40
    assert standard_input_tokens(Usage(100, 60, cache_write_tokens=30)) == 10
    assert standard_input_tokens(Usage(10, 60)) == 0  # a backend's inconsistency bills nothing


def test_each_part_priced_per_million_tokens() -> None:
    cost = price_usage(Usage(1_000_000, 200_000, 50_000, cache_write_tokens=100_000), PRICE)
    assert cost == Cost(  # in 1e-10 USD units: $1.75, $0.25, $0.3125, $0.5, $2.8125, $3.0
        input=17_500_000_000, cached_input=2_500_000_000, cache_write=3_125_000_000,
        output=5_000_000_000, total=28_125_000_000, without_cache=30_000_000_000, price_id=7,
    )  # fmt: skip


def test_parts_rounded_to_fixed_scale_and_total_is_their_sum() -> None:
    price = PriceVersion(7, "m", PRICE.effective_from, Decimal("0.333333333333"),
                         Decimal("0.0333333333333"), Decimal(0), Decimal("1.777777777777"),
                         "admin")  # fmt: skip
    cost = price_usage(Usage(5, 2, 3), price)
    assert (to_usd(cost.input), to_usd(cost.cached_input), to_usd(cost.output)) == (
        Decimal("0.0000010000"), Decimal("6.67E-8"), Decimal("0.0000053333"))  # fmt: skip
    assert to_usd(cost.total) == Decimal("0.0000064000")
    assert to_usd(cost.without_cache) == Decimal("0.0000016667") + Decimal("0.0000053333")


def test_integer_pricing_rounds_exactly_as_decimal_half_even() -> None:
    """Every remainder class, ties included, against Decimal quantize at 1e-10 USD."""
    for usd in ("0.0000000001", "0.0000000003", "0.0000000005", "0.0000001234", "1.5", "3"):
        price = PriceVersion(1, "m", PRICE.effective_from, Decimal(usd), Decimal(usd),
                             Decimal(usd), Decimal(usd), "admin")  # fmt: skip
        for tokens in (*range(0, 3_000_001, 250_000), *range(499_990, 500_011), 2**31 - 1):
            exact = quantize(tokens * Decimal(usd) / 1_000_000)
            assert to_usd(price_usage(Usage(tokens), price).input) == exact, (usd, tokens)


def test_unpriced_or_usage_less_calls_cost_nothing() -> None:
    assert price_usage(Usage(100, 0, 100), None) == Cost()
    assert price_usage(None, PRICE) == Cost(price_id=7)
