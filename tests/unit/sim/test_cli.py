import argparse
import socket

import pytest

from gateway.sim import cli
from gateway.sim.config import SimConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_one_cache_size_for_all_or_one_per_instance() -> None:
    same = cli.configs(parse("--instances", "3", "--cache-blocks", "100"))
    assert [c.cache_blocks for c in same] == [100, 100, 100]
    each = cli.configs(parse("--instances", "2", "--cache-blocks", "64,128", "--step-ms", "5"))
    assert [c.cache_blocks for c in each] == [64, 128]
    assert {c.step_ms for c in each} == {5.0}


def test_one_speed_for_all_or_one_per_instance() -> None:
    assert [c.speed for c in cli.configs(parse("--instances", "2"))] == [1.0, 1.0]
    each = cli.configs(parse("--instances", "3", "--speed", "1,1,0.5"))
    assert [c.speed for c in each] == [1.0, 1.0, 0.5]


def test_defaults_are_simconfigs() -> None:
    (config,) = cli.configs(parse())
    assert config == SimConfig()


@pytest.mark.parametrize(
    "argv",
    [
        ("--instances", "2", "--cache-blocks", "1,2,3"),
        ("--instances", "2", "--speed", "1,0.5,2"),
        ("--speed", "0"),
        ("--speed", "fast"),
        (
            "--instances",
            "0",
        ),
        ("--instances", "2", "--name", "one"),
        (
            "--block-size",
            "0",
        ),
    ],
)
def test_inconsistent_options_exit_with_a_message(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit, match=r"."):
        cli.configs(parse(*argv))


def test_a_busy_port_exits_with_a_message() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{port}"):
            cli.run(parse("--port", str(port)))
