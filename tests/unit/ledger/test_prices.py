from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gateway.ledger.prices import PriceBook, PriceVersion, config_changes
from gateway.settings import ModelSettings, PriceSettings

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def version(id_: int, model: str, start: datetime, output: str) -> PriceVersion:
    d = Decimal(output)
    return PriceVersion(id_, model, start, d, d, d, d, "config")


def test_the_version_in_force_at_a_time() -> None:
    book = PriceBook([version(2, "m", T0 + timedelta(days=1), "2"), version(1, "m", T0, "1")])
    assert book.at("m", (T0 - timedelta(seconds=1)).timestamp()) is None
    found = [book.at("m", (T0 + timedelta(hours=h)).timestamp()) for h in (0, 23, 24, 99)]
    assert [v.id if v else None for v in found] == [1, 1, 2, 2]
    assert book.at("other", T0.timestamp()) is None
    assert book.at(None, T0.timestamp()) is None


def model(name: str, **price: str) -> ModelSettings:
    backends = [{"url": "http://b"}]
    if not price:
        return ModelSettings.model_validate({"name": name, "backends": backends})
    return ModelSettings.model_validate({"name": name, "backends": backends, "price": price})


def test_config_sync_writes_only_changed_explicit_prices() -> None:
    book = PriceBook([version(1, "same", T0, "1"), version(2, "changed", T0, "1")])
    models = [
        model("same", input="1", cached_input="1", cache_write="1", output="1"),
        model("changed", input="1", cached_input="1", cache_write="1", output="1.5"),
        model("new", input="0.1", output="0.2"),
        model("admin-managed"),  # no price in the config: the admin API owns it
    ]
    changes = config_changes(book, models, T0 + timedelta(hours=1))
    assert changes == [
        ("changed", PriceSettings(input=Decimal(1), cached_input=Decimal(1),
                                  cache_write=Decimal(1), output=Decimal("1.5"))),
        ("new", PriceSettings(input=Decimal("0.1"), output=Decimal("0.2"))),
    ]  # fmt: skip
