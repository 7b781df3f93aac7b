"""A run's figures: built from samples, printed as a table, saved as JSON.

Latencies are in milliseconds and computed over successful requests only (a failed
request has no meaningful TTFT); throughput counts successful requests over the lane's
wall time, from its first dispatch to its last completion.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway.bench.client import Sample
from gateway.bench.stats import mean, percentiles, ratio


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What was run, the same for every target of a comparison."""

    workload: str
    seed: int
    model: str
    load: str
    """"concurrency=8" or "rate=5/s"."""


@dataclass(frozen=True, slots=True)
class Steady:
    """A run's figures once the caches are warm.

    The first requests of a run find every prefix cold: the first sight of each shared
    system prompt is a full prefill on any router, ideal or not, and with 32 of them in
    840 requests (3.8%) they alone set the TTFT p99. A deployment lives in the steady state
    that follows, where routing decides who prefills what again.
    """

    after: int
    """Requests sent before the window opened (in dispatch order)."""
    requests: int
    hit_ratio: float | None
    ttft_ms: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class Report:
    target: str
    base_url: str
    workload: str
    seed: int
    model: str
    load: str
    requests: int
    ok: int
    errors: dict[str, int]
    elapsed_s: float
    ttft_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    hit_ratio: float | None
    """Sum of cached_tokens over sum of prompt_tokens (None when no usage came back)."""
    instances: dict[str, int]
    """Requests per backend instance, from x-backend-instance ("unknown" when absent)."""
    mix_digest: str
    """Hash of the requests sent (conversation, turn, user text): equal digests, same mix."""
    steady: Steady | None = None
    """The same figures without the first ``Options.steady_after`` requests sent."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    samples: Sequence[Sample],
    *,
    target: str,
    base_url: str,
    info: RunInfo,
    elapsed: float,
    steady_after: int = 0,
) -> Report:
    ok = [s for s in samples if s.error is None]
    gaps = [g for s in ok for g in s.gaps]
    ttft = _ttft(ok)
    e2e = _ms(percentiles([s.latency for s in ok if s.latency is not None], (50, 99)))
    itl = _ms([mean(gaps), *percentiles(gaps, (50, 99))])
    output = sum(s.completion_tokens for s in ok)
    prompt = sum(s.prompt_tokens for s in samples)
    cached = sum(s.cached_tokens for s in samples)
    return Report(
        target=target,
        base_url=base_url,
        workload=info.workload,
        seed=info.seed,
        model=info.model,
        load=info.load,
        requests=len(samples),
        ok=len(ok),
        errors=dict(Counter(s.error for s in samples if s.error is not None)),
        elapsed_s=elapsed,
        ttft_ms=ttft,
        e2e_ms=dict(zip(("p50", "p99"), e2e, strict=True)),
        itl_ms=dict(zip(("mean", "p50", "p99"), itl, strict=True)),
        requests_per_s=len(ok) / elapsed if elapsed > 0 else 0.0,
        output_tokens_per_s=output / elapsed if elapsed > 0 else 0.0,
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=output,
        hit_ratio=ratio(cached, prompt),
        instances=dict(sorted(Counter(s.instance for s in samples).items())),
        mix_digest=mix_digest(samples),
        steady=steady(samples, steady_after) if steady_after else None,
    )


def steady(samples: Sequence[Sample], after: int) -> Steady:
    """Figures over the samples sent after the first ``after`` (by send time)."""
    late = sorted(samples, key=lambda s: s.started)[after:]
    return Steady(
        after=after,
        requests=len(late),
        hit_ratio=ratio(sum(s.cached_tokens for s in late), sum(s.prompt_tokens for s in late)),
        ttft_ms=_ttft([s for s in late if s.error is None]),
    )


def _ttft(ok: Sequence[Sample]) -> dict[str, float | None]:
    values = _ms(percentiles([s.ttft for s in ok if s.ttft is not None], (50, 90, 99)))
    return dict(zip(("p50", "p90", "p99"), values, strict=True))


def mix_digest(samples: Sequence[Sample]) -> str:
    """Order-independent: concurrency reorders completions, not the set of requests."""
    lines = sorted(f"{s.turn.conversation}\t{s.turn.index}\t{s.turn.user}" for s in samples)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _ms(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else v * 1000 for v in values]


def render(report: Report) -> str:
    """The human-readable table printed on stdout."""
    r = report
    failed = r.requests - r.ok
    rows = [
        ("target", r.target if r.target == r.base_url else f"{r.target} ({r.base_url})"),
        ("workload", f"{r.workload} seed={r.seed} model={r.model} {r.load}"),
        ("requests", f"{r.requests} sent, {r.ok} ok, {failed} failed in {r.elapsed_s:.2f} s"),
        ("throughput", f"{r.requests_per_s:.1f} req/s, {r.output_tokens_per_s:.1f} output tok/s"),
        ("TTFT ms", _figures(r.ttft_ms)),
        ("e2e ms", _figures(r.e2e_ms)),
        ("ITL ms", _figures(r.itl_ms)),
        ("cache", _cache(r)),
        *([("steady", _steady(r.steady))] if r.steady else []),
        ("errors", _counts(r.errors) or "none"),
        ("instances", _counts(r.instances) or "none"),
        ("mix", r.mix_digest),
    ]
    return "\n".join(f"{name:<12}{value}" for name, value in rows)


def _steady(s: Steady) -> str:
    hit = _num(s.hit_ratio, ".3f")
    return f"after {s.after} sent: {s.requests} requests, hit {hit}, TTFT ms {_figures(s.ttft_ms)}"


def _figures(values: dict[str, float | None]) -> str:
    return "  ".join(f"{k} {_num(v)}" for k, v in values.items())


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _cache(r: Report) -> str:
    hit = "-" if r.hit_ratio is None else f"{r.hit_ratio:.1%}"
    return f"hit ratio {hit} ({r.cached_tokens:,} of {r.prompt_tokens:,} prompt tokens cached)"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items())


def ratios(reports: Sequence[Report]) -> list[dict[str, Any]]:
    """Each later target against the first: latency and throughput ratios, hit-ratio delta."""
    base = reports[0]
    return [
        {
            "target": r.target,
            "baseline": base.target,
            "ttft_p50_ratio": _div(r.ttft_ms["p50"], base.ttft_ms["p50"]),
            "ttft_p99_ratio": _div(r.ttft_ms["p99"], base.ttft_ms["p99"]),
            "e2e_p50_ratio": _div(r.e2e_ms["p50"], base.e2e_ms["p50"]),
            "e2e_p99_ratio": _div(r.e2e_ms["p99"], base.e2e_ms["p99"]),
            "itl_mean_ratio": _div(r.itl_ms["mean"], base.itl_ms["mean"]),
            "rps_ratio": _div(r.requests_per_s, base.requests_per_s),
            "output_tps_ratio": _div(r.output_tokens_per_s, base.output_tokens_per_s),
            "hit_ratio_diff_points": _points(r.hit_ratio, base.hit_ratio),
        }
        for r in reports[1:]
    ]


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _points(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (a - b) * 100


def render_ratios(rows: Sequence[dict[str, Any]]) -> str:
    """One column per compared target, one row per figure."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if k not in ("target", "baseline")]
    width = max(12, *(len(r["target"]) + 2 for r in rows))
    head = f"{'vs ' + rows[0]['baseline']:<24}" + "".join(f"{r['target']:>{width}}" for r in rows)
    body = [
        f"{key:<24}"
        + "".join(f"{_num(r[key], '+.1f' if 'points' in key else '.3f'):>{width}}" for r in rows)
        for key in keys
    ]
    return "\n".join([head, *body])
