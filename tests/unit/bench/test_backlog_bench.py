import pytest

from gateway.bench import backlog


@pytest.mark.parametrize(("in_flight", "slots"), backlog.SHAPES)
def test_every_shape_times_a_backend_whose_slots_are_awaited(in_flight: int, slots: int) -> None:
    b = backlog.backlog(in_flight, slots)
    load = b.load(5, in_flight, 0.5, slots)
    assert load.slot_wait > 0  # the forecast over every running call is what is timed
    assert load.running == in_flight
    assert len(b.pending(0.0)) == in_flight // 10 + (in_flight % 10 > 0)


def test_one_row_per_shape(capsys: pytest.CaptureFixture[str]) -> None:
    backlog.main(["--repeat", "1"])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert len(rows) == len(backlog.SHAPES)
    for row, (in_flight, slots) in zip(rows, backlog.SHAPES, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[:2] == [f"{in_flight:,}", str(slots)]
        assert float(cells[2]) > 0
