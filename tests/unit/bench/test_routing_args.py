from __future__ import annotations

from gateway.bench import zoo
from gateway.bench.routers import ZOO_SETUPS
from gateway.bench.routing import QUICK_DURATION, Bench, bench_from, chosen, parse_args


def test_the_whole_zoo_against_every_router_on_two_seeds_by_default() -> None:
    args = parse_args([])
    assert chosen(args) == list(zoo.ZOO.values())
    assert args.configs == list(ZOO_SETUPS)
    assert args.seeds == [0, 1]
    assert bench_from(args).duration == Bench().duration


def test_a_list_of_scenarios_and_quick() -> None:
    args = parse_args(["--workload", "agents", "documents", "agents", "--quick"])
    assert [s.name for s in chosen(args)] == ["agents", "documents"]
    assert bench_from(args).duration == QUICK_DURATION


def test_rate_scales_with_speed_and_load_and_the_slow_instance_is_slow() -> None:
    agents, slow = zoo.ZOO["agents"], zoo.ZOO["slow-backend"]
    base = Bench()
    assert Bench(speed=2 * base.speed).rate(agents, 0) == 2 * base.rate(agents, 0)
    assert Bench(load=0.5).rate(agents, 0) < base.rate(agents, 0) < Bench(load=0.9).rate(agents, 0)
    speeds = base.sim_options(slow, 4)[-1].split(",")
    assert [float(v) for v in speeds] == [base.speed] * 3 + [base.speed / 2]
    assert base.sim_options(slow, 1)[-1] == f"{base.speed:g}"
