"""A step that trains on nothing says why (from build_train_batch's own metrics), and the run's
last line summarises reward, correct rate and speedup from the first step to the last."""
from pipeline.algorithms import AlgorithmConfig, build_train_batch
from pipeline.algorithms import skip_reason
from pipeline.main import summary_line
from pipeline.sample import Sample
from tests.pipeline.conftest import group


def samples(scores, finish="stop", tokens=3):
    return [Sample(uid=f"0/t/{j}/0", step=0, task_id="t", traj=j, turn=0, prompt_ids=[5, 6],
                   response_ids=[7] * tokens, logprobs=[-1.0] * tokens, finish_reason=finish,
                   score=s, policy_version=0) for j, s in enumerate(scores)]


def reason(batch_samples, earlier=None):
    algo = group(AlgorithmConfig, "algorithm/grpo_plus")
    batch = build_train_batch(batch_samples, algo, 3, 0)
    assert len(batch) == 0
    return skip_reason(batch.metrics, batch_samples, earlier)


def test_skip_reasons_name_the_cause():
    assert "zero advantage" in reason(samples([0.0] * 4))
    assert "mean score 1.300" in reason(samples([1.3] * 4))
    assert "overlong" in reason(samples([0.0, 1.0, 0.5, 2.0], finish="length", tokens=3))
    assert "failed to generate" in reason(samples([0.0, 1.0], finish="error"))


def test_a_policy_that_stopped_scoring_is_told_from_one_that_never_did():
    """After a batch that scored, an all-zero batch points at the update size, not at the model."""
    collapsed = reason(samples([0.0] * 4), earlier=(0, 0.537))
    assert "stopped solving" in collapsed and "step 0's batch had mean score 0.537" in collapsed
    assert "trainer.optim.lr" in collapsed and "model.warm_start" not in collapsed
    never = reason(samples([0.0] * 4), earlier=(0, 0.0))
    assert "model.warm_start" in never and "stopped solving" not in never
    assert "stopped solving" not in reason(samples([1.3] * 4), earlier=(0, 0.5))  # all equal, not zero


def test_a_batch_with_different_scores_trains():
    algo = group(AlgorithmConfig, "algorithm/grpo_plus")
    assert len(build_train_batch(samples([0.0, 1.0, 0.5, 2.0]), algo, 3, 0)) == 4


def test_summary_line_reports_first_and_last_steps():
    hist = [{"step": i, "critic/score/mean": r, "kernel/correct": c, "kernel/speedup_mean": s,
             "actor/skipped": k} for i, (r, c, s, k) in
            enumerate([(0.2, 0.25, 0.9, 0.0), (0.4, 0.5, 1.0, 0.0), (0.6, 0.5, 1.1, 1.0), (1.0, 0.75, 1.3, 0.0)])]
    line = summary_line(hist)
    assert "step 0 -> 3" in line and "reward 0.200 -> 1.000" in line
    assert "first two steps 0.300 -> last two 0.800" in line
    assert "correct 0.250 -> 0.750" in line and "mean speedup 0.900 -> 1.300" in line
    assert "trained on nothing: [2]" in line
