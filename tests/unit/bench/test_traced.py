"""The soak's heap report names each cache by where it hangs and what holds it."""

from __future__ import annotations

from gateway.bench import traced
from gateway.settings import PrefixSettings
from gateway.stages.prefix import PrefixHasher


def test_walk_reports_every_container_under_the_gateways_objects_by_path() -> None:
    hasher = PrefixHasher(PrefixSettings(token_cache_mb=1))
    hasher._pieces.put(("enc", "a piece"), b"\x01\x00\x00\x00")
    sizes = dict(traced.walk(hasher, "prefix", set(), depth=6))
    assert sizes == {"prefix._encodings": 0, "prefix._pieces": 1, "prefix._pieces._entries": 1}


def test_largest_names_what_holds_each_container() -> None:
    class Holder:
        def __init__(self) -> None:
            self.cache = {i: i for i in range(1000)}

    holder = Holder()
    (line,) = traced.largest([holder.cache, [1, 2]], count=1)
    assert line.startswith("dict of 1,000 in ")
    assert "Holder.cache" in line
