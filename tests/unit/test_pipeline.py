import pytest

from gateway.pipeline import accuracy


@pytest.mark.parametrize(
    ("predicted", "reported", "outcome"),
    [
        (0.9, 0.85, "accurate"),
        (0.0, 0.1, "accurate"),
        (0.9, 0.5, "over"),
        (0.0, 0.6, "under"),
    ],
)
def test_prediction_accuracy_compares_shares(
    predicted: float, reported: float, outcome: str
) -> None:
    assert accuracy(predicted, reported) == outcome
