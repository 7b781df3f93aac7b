"""Price versions held in memory, so pricing a call never queries the database.

A :class:`PriceBook` is immutable; a refresh builds a new one and swaps the reference,
so the hot path needs no lock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from gateway.ledger.models import quantize, to_units
from gateway.settings import ModelSettings, PriceSettings


@dataclass(frozen=True, slots=True)
class PriceVersion:
    """USD per million tokens of each kind for one model, from effective_from on."""

    id: int
    model: str
    effective_from: datetime
    input: Decimal
    cached_input: Decimal
    cache_write: Decimal
    output: Decimal
    source: str
    units: tuple[int, int, int, int] = field(init=False, compare=False, repr=False)
    """The four prices in integer 1e-10 USD units per million tokens, so that pricing a
    call is integer arithmetic (prices are stored at that scale: exact)."""

    def __post_init__(self) -> None:
        prices = (self.input, self.cached_input, self.cache_write, self.output)
        object.__setattr__(self, "units", tuple(to_units(quantize(p)) for p in prices))

    def same_price(self, price: PriceSettings) -> bool:
        return (self.input, self.cached_input, self.cache_write, self.output) == (
            price.input,
            price.cached_input,
            price.cache_write,
            price.output,
        )


class PriceBook:
    """Every model's price history, ordered by effective_from."""

    def __init__(self, versions: Iterable[PriceVersion] = ()) -> None:
        self._by_model: dict[str, list[PriceVersion]] = {}
        for v in sorted(versions, key=lambda v: (v.model, v.effective_from)):
            self._by_model.setdefault(v.model, []).append(v)
        self._starts = {
            m: [v.effective_from.timestamp() for v in vs] for m, vs in self._by_model.items()
        }

    def at(self, model: str | None, when: float) -> PriceVersion | None:
        """The version in force at epoch time ``when``; None if the model had no price yet."""
        if model is None or model not in self._starts:
            return None
        i = bisect.bisect_right(self._starts[model], when)
        return self._by_model[model][i - 1] if i else None

    def history(self, model: str | None = None) -> list[PriceVersion]:
        if model is not None:
            return list(self._by_model.get(model, []))
        return [v for vs in self._by_model.values() for v in vs]


def config_changes(
    book: PriceBook, models: Iterable[ModelSettings], now: datetime
) -> list[tuple[str, PriceSettings]]:
    """Configured prices that differ from the version in force now.

    Only models whose config names a price take part: a model configured without one
    keeps whatever the admin API set, instead of being reset to zero at every restart.
    """
    changes = []
    for m in models:
        if "price" not in m.model_fields_set:
            continue
        current = book.at(m.name, now.timestamp())
        if current is None or not current.same_price(m.price):
            changes.append((m.name, m.price))
    return changes
