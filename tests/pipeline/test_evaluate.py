"""Held-out evaluation: per-turn-budget attempts, and the CLI's run on ToyEnv's holdout split."""
import json

import pytest

from pipeline.evaluate import attempts_by_budget, evaluation_metrics
from pipeline.sample import Sample
from rewards.interface import TurnOutcome
from tests.pipeline.test_e2e import config


def _s(task, traj, turn, correct, speedup=None):
    return Sample(uid=f"0/{task}/{traj}/{turn}", step=0, task_id=task, traj=traj, turn=turn,
                  prompt_ids=[1], response_ids=[2], logprobs=[-1.0], finish_reason="stop",
                  score=1.0 if correct else 0.0, policy_version=0,
                  outcome=TurnOutcome(score=0.0, feedback="", correct=correct, speedup=speedup))


def test_turn_budgets_take_the_best_correct_turn_so_far():
    samples = [_s("a", 0, 0, False), _s("a", 0, 1, True, 1.5),
               _s("a", 1, 0, True, 0.5), _s("a", 1, 1, True, 2.5),
               _s("b", 0, 0, False), _s("b", 0, 1, False)]
    by = attempts_by_budget(samples, turns=2)
    assert by[1] == [("a", False, None), ("a", True, 0.5), ("b", False, None)]
    assert by[2] == [("a", True, 1.5), ("a", True, 2.5), ("b", False, None)]
    m = evaluation_metrics(samples, turns=2, ks=[1], fast_ps=[1.0])
    assert m["eval/pass@1/turns_1"] == pytest.approx(0.25)   # a: 1 of 2, b: 0 of 1
    assert m["eval/pass@1"] == pytest.approx(0.5)            # a: 2 of 2 by turn 2
    assert m["eval/best_speedup"] == pytest.approx((2.5 + 0) / 2)
    assert m["eval/fast_1"] == pytest.approx(0.5)


@pytest.mark.slow
def test_evaluate_cli_on_toy_holdout(ray_local, tmp_path):
    from pipeline.evaluate import run

    cfg = config("+experiment=toy", "evaluate.k=4", "evaluate.ks=[1,4]", "rollout.turns=2")
    metrics = run(cfg, tmp_path)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved == metrics
    assert metrics["eval/tasks"] == 2 and metrics["eval/attempts_per_task"] == 4
    assert 0.0 <= metrics["eval/pass@1"] <= metrics["eval/pass@4"] <= 1.0
    assert metrics["eval/pass@1/turns_1"] <= metrics["eval/pass@1"]
    with pytest.raises(ValueError, match="evaluate.ks"):
        run(config("+experiment=toy", "evaluate.k=2", "evaluate.ks=[4]"), tmp_path)


def test_an_empty_split_stops_before_ray_starts(monkeypatch, tmp_path):
    """The laptop's one task is in the train split: evaluating its holdout names the empty split
    and the chosen tasks at once, before Ray and the model start (it failed after both before)."""
    import pipeline.resources
    from pipeline.evaluate import run

    def no_ray(*_a, **_k):
        raise AssertionError("Ray started for a split with no tasks")

    monkeypatch.setattr(pipeline.resources, "init_ray", no_ray)
    cfg = config("+experiment=kernel_multiturn", "reward.task_ids=[L1/19_silu]", "evaluate.split=holdout")
    with pytest.raises(ValueError, match=r"evaluate.split='holdout' has no tasks .*L1/19_silu"):
        run(cfg, tmp_path)
