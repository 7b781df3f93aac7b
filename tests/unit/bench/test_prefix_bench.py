import pytest

from gateway.bench import prefix


def test_each_prompt_is_about_a_thousand_tokens_and_timed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix.main(["--calls", "3", "--repeat", "1"])
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [r.rsplit(maxsplit=3)[0] for r in rows] == list(prefix.PROMPTS)
    for row in rows:
        tokens, per_call, per_1k = row.rsplit(maxsplit=3)[1:]
        assert 950 <= int(tokens) <= 1250
        assert float(per_call) > 0
        assert abs(float(per_1k) - float(per_call) * 1000 / int(tokens)) < 0.2
