"""pipeline.evaluate reports the mean score (the quantity training logs as critic/score/mean)."""
import pytest

from pipeline.evaluate import evaluation_metrics
from tests.pipeline.test_evaluate import _s


def test_mean_and_best_score():
    samples = [_s("a", 0, 0, True, 1.5), _s("a", 1, 0, False), _s("b", 0, 0, False)]
    m = evaluation_metrics(samples, turns=1, ks=[1], fast_ps=[1.0])
    assert m["eval/score/mean"] == pytest.approx(1 / 3)
    assert m["eval/score/best_mean"] == pytest.approx(0.5)  # a: 1, b: 0
