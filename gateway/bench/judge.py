"""The routing benchmark's results, the checks the gateway is judged by, and their tables.

Checks, for the subject (the gateway's cache-aware policy) on each scenario and seed, over
the whole run and over the steady window (calls sent after the first quarter):

- hit ratio at least 0.97x ideal sticky's, and at least the best peer's;
- TTFT p99 no higher than round robin's, and lower than every peer's;
- TTFT p50 no higher than the best peer's;
- the busiest instance's work (engine seconds) over the mean at most 1.2, where the
  scenario can be balanced. Work, not calls: where calls differ tenfold in prompt and
  answer (tenants), an even count of them is an uneven load, and a router that evens the
  count does so by moving calls away from the caches that hold their prefixes. The calls'
  balance is reported beside.

Peers are the routers a deployment could pick instead (``routers.PEERS``). A check whose
reference configuration did not run is left out. Where a configuration ran more than once
for the same scenario and seed, its figures are averaged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.bench.routers import PEERS, ROUND_ROBIN, STICKY, SUBJECT

STICKY_SHARE = 0.97
BALANCE = 1.2
WINDOWS = ("whole", "steady")


@dataclass(slots=True)
class Result:
    """One configuration's run on one scenario and seed."""

    setup: str
    workload: str
    """The scenario's name."""
    seed: int
    rate: float
    """Poisson arrivals per second outside bursts."""
    requests: int
    ok: int
    errors: dict[str, int]
    hit_ratio: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    instances: dict[str, int]
    """Calls each instance finished, from its own counter."""
    imbalance: float | None
    """The busiest instance's calls over the mean."""
    balanceable: bool = True
    steady_hit: float | None = None
    steady_p50_ms: float | None = None
    steady_p99_ms: float | None = None
    steady_imbalance: float | None = None
    """The same figures for the calls after the warm-up (counters read when it ended)."""
    busy: dict[str, float] = field(default_factory=dict)
    """Engine seconds each instance worked (the simulator's cost model)."""
    work_imbalance: float | None = None
    """The busiest instance's engine seconds over the mean: balance by load, where calls
    differ in size."""
    steady_work_imbalance: float | None = None
    predictions: dict[str, int] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)
    misses_by_decision: dict[str, int] = field(default_factory=dict)
    """Inaccurate predictions ("over"/"under") per routing decision, from the ledger."""
    machine_load: float | None = None
    """The 1-minute load average when the run ended: other work on a shared machine shows
    here, and TTFT tails measured under it say more about the machine than the router."""

    @property
    def accurate(self) -> float | None:
        total = sum(self.predictions.values())
        return self.predictions.get("accurate", 0) / total if total else None

    def figure(self, name: str, window: str) -> float | None:
        """hit, p50, p99 or work (busiest over mean), over the whole run or the steady
        window."""
        whole = {"hit": self.hit_ratio, "p50": self.ttft_p50_ms, "p99": self.ttft_p99_ms,
                 "work": self.work_imbalance}  # fmt: skip
        steady = {"hit": self.steady_hit, "p50": self.steady_p50_ms,
                  "p99": self.steady_p99_ms, "work": self.steady_work_imbalance}  # fmt: skip
        return (steady if window == "steady" else whole)[name]


@dataclass(frozen=True, slots=True)
class Check:
    scenario: str
    seed: int
    window: str
    goal: str
    mine: float
    reference: float
    ok: bool


Figures = dict[str, dict[str, float]]
"""Per configuration, its mean figures (hit, p50, p99, work) in one window."""
Goal = tuple[str, str, Callable[[Figures], float | None], Callable[[float, float], bool]]


def _best(name: str, pick: Callable[[list[float]], float]) -> Callable[[Figures], float | None]:
    def reference(rows: Figures) -> float | None:
        known = [rows[p][name] for p in PEERS if p in rows and not math.isnan(rows[p][name])]
        return pick(known) if known else None

    return reference


def _of(setup: str, name: str, scale: float = 1.0) -> Callable[[Figures], float | None]:
    def reference(rows: Figures) -> float | None:
        return rows[setup][name] * scale if setup in rows else None

    return reference


GOALS: tuple[Goal, ...] = (
    ("hit >= 0.97 sticky", "hit", _of(STICKY, "hit", STICKY_SHARE), lambda m, r: m >= r),
    ("hit >= best peer", "hit", _best("hit", max), lambda m, r: m >= r),
    ("p99 <= round robin", "p99", _of(ROUND_ROBIN, "p99"), lambda m, r: m <= r),
    ("p99 < every peer", "p99", _best("p99", min), lambda m, r: m < r),
    ("p50 <= best peer", "p50", _best("p50", min), lambda m, r: m <= r),
    ("work max/mean <= 1.2", "work", lambda rows: BALANCE, lambda m, r: m <= r),
)


def judge(results: Sequence[Result], subject: str = SUBJECT) -> list[Check]:
    """Every goal for the subject, per scenario, seed and window."""
    checks = []
    for (scenario, seed), runs in _groups(results).items():
        names = {r.setup for r in runs}
        if subject not in names:
            continue
        balanceable = all(r.balanceable for r in runs)
        for window in WINDOWS:
            rows = {n: _mean([r for r in runs if r.setup == n], window) for n in names}
            mine = rows[subject]
            for goal, name, reference, passes in GOALS:
                ref = reference(rows)
                if ref is None or math.isnan(mine[name]) or math.isnan(ref):
                    continue
                if name == "work" and not balanceable:
                    continue
                ok = passes(mine[name], ref)
                checks.append(Check(scenario, seed, window, goal, mine[name], ref, ok))
    return checks


def _groups(results: Sequence[Result]) -> dict[tuple[str, int], list[Result]]:
    groups: dict[tuple[str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.workload, r.seed), []).append(r)
    return groups


def _mean(runs: Sequence[Result], window: str) -> dict[str, float]:
    out = {}
    for name in ("hit", "p50", "p99", "work"):
        known = [v for r in runs if (v := r.figure(name, window)) is not None]
        out[name] = sum(known) / len(known) if known else math.nan
    return out


def render_checks(checks: Sequence[Check]) -> str:
    """One line per scenario, seed and window; a cell per goal: ok/NO, mine / reference."""
    goals = [g[0] for g in GOALS]
    lines = [f"{'scenario':<14}{'seed':>5} {'window':<7}" + "".join(f"{g:>21}" for g in goals)]
    for key, cells in _check_rows(checks).items():
        scenario, seed, window = key
        text = "".join(f"{cells.get(g, '-'):>21}" for g in goals)
        lines.append(f"{scenario:<14}{seed:>5} {window:<7}{text}")
    passed = sum(c.ok for c in checks)
    lines.append(f"{passed} of {len(checks)} checks met")
    return "\n".join(lines)


def markdown_checks(checks: Sequence[Check]) -> str:
    goals = [g[0] for g in GOALS]
    lines = ["| scenario | seed | window | " + " | ".join(goals) + " |",
             "|---" * (len(goals) + 3) + "|"]  # fmt: skip
    for (scenario, seed, window), cells in _check_rows(checks).items():
        row = " | ".join(cells.get(g, "-") for g in goals)
        lines.append(f"| {scenario} | {seed} | {window} | {row} |")
    return "\n".join(lines)


def _check_rows(checks: Sequence[Check]) -> dict[tuple[str, int, str], dict[str, str]]:
    rows: dict[tuple[str, int, str], dict[str, str]] = {}
    for c in checks:
        fmt = ".3f" if c.goal.startswith("hit") else ".2f" if "max" in c.goal else ".0f"
        cell = f"{'ok' if c.ok else 'NO'} {c.mine:{fmt}} / {c.reference:{fmt}}"
        rows.setdefault((c.scenario, c.seed, c.window), {})[c.goal] = cell
    return rows


def render(results: Sequence[Result]) -> str:
    """Every run's figures, one line each."""
    head = (f"{'scenario':<14}{'seed':>4} {'config':<25}{'rate':>6}{'hit':>6}{'p50':>7}"
            f"{'p99':>7}{'| steady:':>9}{'hit':>6}{'p50':>6}{'p99':>7}{'max/mean':>9}"
            f"{'steady':>7}{'work':>6}{'pred ok':>8}{'load':>6}  instances / errors")  # fmt: skip
    return "\n".join([head, *(line(r) for r in results)])


def line(r: Result) -> str:
    counts = "/".join(str(c) for c in r.instances.values())
    errors = f"  errors {dict(r.errors)}" if r.errors else ""
    return (
        f"{r.workload:<14}{r.seed:>4} {r.setup:<25}{r.rate:>6.1f}{num(r.hit_ratio, '.2f'):>6}"
        f"{num(r.ttft_p50_ms):>7}{num(r.ttft_p99_ms):>7}{'|':>9}{num(r.steady_hit, '.2f'):>6}"
        f"{num(r.steady_p50_ms):>6}{num(r.steady_p99_ms):>7}{num(r.imbalance, '.2f'):>9}"
        f"{num(r.steady_imbalance, '.2f'):>7}{num(r.work_imbalance, '.2f'):>6}"
        f"{num(r.accurate, '.0%'):>8}"
        f"{num(r.machine_load, '.1f'):>6}  {counts}{errors}"
    )


def render_misses(results: Sequence[Result]) -> str:
    """The gateway's inaccurate predictions, by decision and kind."""
    return "\n".join(
        f"{r.workload:<14}{r.seed:>4} {r.setup:<25}inaccurate: {r.misses_by_decision or 'none'}"
        for r in results
        if r.predictions
    )


def markdown(results: Sequence[Result]) -> str:
    """The README's figures: a row per configuration, a column per scenario, each cell
    hit / TTFT p50 / p99 ms / busiest over mean by work (by calls), whole run, as a range
    over the seeds."""
    names = list(dict.fromkeys(r.setup for r in results))
    scenarios = list(dict.fromkeys(r.workload for r in results))
    lines = ["| config | " + " | ".join(scenarios) + " |", "|---" * (len(scenarios) + 1) + "|"]
    for name in names:
        cells = []
        for s in scenarios:
            runs = [r for r in results if r.setup == name and r.workload == s]
            cells.append(" / ".join([
                spread([r.hit_ratio for r in runs], ".2f"),
                spread([r.ttft_p50_ms for r in runs], ".0f"),
                spread([r.ttft_p99_ms for r in runs], ".0f"),
                spread([r.work_imbalance for r in runs], ".2f")
                + f" ({spread([r.imbalance for r in runs], '.2f')})",
            ]))  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread(values: Sequence[float | None], fmt: str) -> str:
    known = sorted(v for v in values if v is not None)
    if not known:
        return "-"
    low, high = format(known[0], fmt), format(known[-1], fmt)
    return low if low == high else f"{low}-{high}"


def num(value: float | None, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value, fmt)
