import pytest
import torch

from pipeline.algorithms import build_train_batch, rollout_metrics
from pipeline.sample import Sample
from tests.pipeline.algorithms.conftest import algo


def sample(task, traj, turn, score, n_resp=3, finish="stop", text="", step=0):
    prompt = list(range(10, 10 + 2 + traj + turn))           # prompt lengths differ per row
    resp = [100 + turn * 10 + traj + k for k in range(n_resp)]
    return Sample(uid=f"{step}/{task}/{traj}/{turn}", step=step, task_id=task, traj=traj, turn=turn,
                  prompt_ids=prompt, response_ids=resp, logprobs=[-0.5 - k for k in range(n_resp)],
                  finish_reason=finish, score=score, policy_version=0, response_text=text)


def batch_samples():
    return [
        sample("t0", 0, 0, 0.0), sample("t0", 0, 1, 0.3, n_resp=5), sample("t0", 0, 2, 1.3),
        sample("t0", 1, 0, 0.3), sample("t0", 1, 1, 0.0, n_resp=6, finish="length"), sample("t0", 1, 2, 0.0),
        sample("t1", 0, 0, 0.0), sample("t1", 0, 1, 0.0), sample("t1", 1, 0, 0.0),
        sample("t1", 1, 1, 0.0, n_resp=0, finish="error"),
    ]


def test_returns_advantages_filters_and_layout():
    samples = batch_samples()
    cfg = algo(norm_by_std=False)
    b = build_train_batch(samples, cfg, max_response_length=6, pad_token_id=0)
    by_uid = {s.uid: s for s in samples}
    rets = {s.uid: s.ret for s in samples}
    assert rets["0/t0/0/0"] == pytest.approx(0.328) and rets["0/t0/0/1"] == pytest.approx(0.82)
    assert rets["0/t0/1/0"] == pytest.approx(0.3) and rets["0/t0/1/2"] == 0.0
    # t0's truncated turn is masked out; t1 (all zero) is dropped; the generation error never trains
    assert b.uids == ["0/t0/0/0", "0/t0/0/1", "0/t0/0/2", "0/t0/1/0", "0/t0/1/2"]
    assert b.group_ids == ["0/t0"] * 5
    mean = (0.328 + 0.82 + 1.3 + 0.3 + 0 + 0) / 6  # the filtered sample still counts in the baseline
    m = b.metrics
    assert (m["batch/samples"], m["batch/gen_errors"], m["batch/overlong_filtered"]) == (10, 1, 1)
    assert (m["batch/groups"], m["batch/groups_dropped_zero_adv"], m["batch/samples_dropped_zero_adv"]) == (2, 1, 3)
    assert m["batch/rows"] == 5 and m["batch/loss_tokens"] == 3 + 5 + 3 + 3 + 3
    P, R = b.prompt_len, b.response_len
    assert (P, R) == (2 + 1 + 2, 5) and b.input_ids.shape == (5, P + R)
    for row, uid in enumerate(b.uids):
        s = by_uid[uid]
        p, r = len(s.prompt_ids), len(s.response_ids)
        assert b.input_ids[row, P - p:P].tolist() == s.prompt_ids       # prompt ends at column P-1
        assert b.input_ids[row, P:P + r].tolist() == s.response_ids     # response starts at P
        assert b.attention_mask[row].tolist() == [0] * (P - p) + [1] * (p + r) + [0] * (R - r)
        assert b.position_ids[row, P - p:P + r].tolist() == list(range(p + r))
        assert b.response_mask[row].tolist() == [1.0] * r + [0.0] * (R - r)
        torch.testing.assert_close(b.advantages[row, :r], torch.full((r,), s.ret - mean))
        assert (b.advantages[row, r:] == 0).all()
        assert b.sampler_log_probs[row, :r].tolist() == s.logprobs
    assert not b.truncated.any()


def test_vanilla_grpo_keeps_zero_advantage_groups_and_truncated_rows():
    b = build_train_batch(batch_samples(), algo("grpo"), 6, 0)
    assert len(b) == 9 and b.metrics["batch/groups_dropped_zero_adv"] == 0
    assert b.truncated.sum() == 1


def test_deepcoder_filter_keeps_truncated_rows_that_scored():
    s = [sample("t", 0, 0, 1.0, finish="length"), sample("t", 1, 0, 0.0, finish="length"),
         sample("t", 2, 0, 0.5)]
    b = build_train_batch(s, algo(overlong_filter="deepcoder"), 3, 0)
    assert b.uids == ["0/t/0/0", "0/t/2/0"] and b.truncated.tolist() == [True, False]


def test_response_longer_than_the_limit_is_clipped_and_counts_as_truncated():
    s = [sample("t", 0, 0, 1.0, n_resp=8), sample("t", 1, 0, 0.0)]
    b = build_train_batch(s, algo(overlong_filter="off"), 4, 0)
    assert b.response_len == 4 and b.truncated.tolist() == [True, False]
    assert b.metrics["batch/clipped_to_max_length"] == 1


def test_nothing_to_learn_gives_zero_rows():
    assert len(build_train_batch([], algo(), 4, 0)) == 0
    b = build_train_batch([sample("t", 0, 0, 1.0), sample("t", 1, 0, 1.0)], algo(), 4, 0)
    assert len(b) == 0 and b.metrics["batch/groups_dropped_zero_adv"] == 1


def test_bad_samples_are_named():
    s = [sample("t", 0, 0, 1.0), sample("t", 1, 0, 0.0)]
    s[1].logprobs = s[1].logprobs[:1]
    with pytest.raises(ValueError, match="0/t/1/0"):
        build_train_batch(s, algo(), 4, 0)
    with pytest.raises(ValueError, match="turn 0"):
        build_train_batch([sample("t", 0, 0, 1.0), sample("t", 0, 0, 0.0)], algo(), 4, 0)


def test_rollout_metrics():
    s = [sample("t", 0, 0, 0.0, text="Okay, the kernel"), sample("t", 0, 1, 1.0, text="<think>\n Okay so"),
         sample("t", 1, 0, 0.5, n_resp=6, finish="length", text="Hmm."),
         sample("t", 1, 1, 0.0, n_resp=0, finish="error")]
    m = rollout_metrics(s, algo())
    assert m["response_length/not_okay_ratio"] == pytest.approx(1 / 3)  # of the responses with text
    assert m["response_length/clip_ratio"] == 0.25 and m["response_length/mean"] == 3.0
    assert m["critic/score/mean"] == 0.375 and m["critic/score/max"] == 1.0
    assert m["critic/score/turn0_mean"] == 0.25 and m["critic/score/turn1_mean"] == 0.5
    assert rollout_metrics(s, algo(not_okay_prefix="Hmm"))["response_length/not_okay_ratio"] == pytest.approx(2 / 3)
    assert rollout_metrics([], algo()) == {}


def test_non_finite_score_counts_as_zero_instead_of_poisoning_the_group():
    s = [sample("t", 0, 0, float("nan")), sample("t", 1, 0, 1.0), sample("t", 2, 0, 0.0)]
    b = build_train_batch(s, algo(norm_by_std=False), 4, 0)
    assert b.metrics["batch/nonfinite_scores"] == 1 and s[0].ret == 0.0
    assert torch.isfinite(b.advantages).all()
    torch.testing.assert_close(b.advantages[:, 0], torch.tensor([-1 / 3, 2 / 3, -1 / 3]))
