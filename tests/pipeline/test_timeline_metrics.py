"""Timeline overlap and drawing, score metrics from outcomes, held-out estimators, checkpoint dirs."""
import itertools
import random
from math import comb
from pathlib import Path

import pytest

from pipeline import checkpoint
from pipeline.eval_metrics import pass_at_k, summarize
from pipeline.metrics import score_metrics
from pipeline.sample import Sample
from pipeline.timeline import Timeline, merge_intervals
from rewards.interface import TurnOutcome


def test_overlap_and_image(tmp_path):
    tl = Timeline()
    tl.add("trainer", "train", 0, 10.0, 14.0)
    tl.add("sampler", "gen", 1, 11.0, 13.0)
    tl.add("sampler", "gen", 2, 15.0, 16.0)
    tl.add_rewards(1, [(12.0, 12.5), (12.2, 13.5), (14.0, 14.2)])
    tl.add("push", "push", 0, 14.0, 14.3)
    assert tl.overlap("train", 0, "gen", 1) == pytest.approx(2.0)
    assert tl.overlap("train", 0, "gen", 2) == 0.0
    assert [(s.start, s.end) for s in tl.of("reward", 1)] == [(12.0, 13.5), (14.0, 14.2)]
    png = tl.draw(tmp_path / "t.png", title="test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tl.to_jsonl(tmp_path / "t.jsonl")
    assert Timeline.from_jsonl(tmp_path / "t.jsonl").overlap("train", 0, "gen", 1) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="lane"):
        tl.add("gpu", "x", 0, 0, 1)
    # busy shares of a window [11, 15]: spans clipped to it, a lane's overlapping spans counted once
    assert tl.busy("trainer", 11.0, 15.0) == pytest.approx(3.0 / 4)
    assert tl.busy("sampler", 11.0, 15.0) == pytest.approx(2.0 / 4)
    assert tl.busy("reward", 11.0, 15.0) == pytest.approx((1.5 + 0.2) / 4)
    assert tl.busy("push", 15.0, 15.0) == 0.0


def test_an_older_runs_sync_lane_loads_as_push(tmp_path):
    """Run dirs written before the weight push had one name call its lane and spans "sync"."""
    (tmp_path / "t.jsonl").write_text('{"lane": "trainer", "kind": "train", "step": 0, "start": 0.0, "end": 2.0}\n'
                                      '{"lane": "sync", "kind": "sync", "step": 0, "start": 2.0, "end": 2.5}\n')
    tl = Timeline.from_jsonl(tmp_path / "t.jsonl")
    assert [(s.lane, s.kind) for s in tl.spans] == [("trainer", "train"), ("push", "push")]
    assert tl.busy("push", 2.0, 3.0) == pytest.approx(0.5)


def test_merge_intervals():
    assert merge_intervals([(3, 4), (1, 2), (1.5, 2.5)]) == [(1, 2.5), (3, 4)]


def _sample(i, score, **outcome):
    return Sample(uid=f"0/t{i % 2}/{i}/0", step=0, task_id=f"t{i % 2}", traj=i, turn=0,
                  prompt_ids=[1], response_ids=[2], logprobs=[-0.1], finish_reason="stop",
                  score=score, policy_version=0, outcome=TurnOutcome(score=score, feedback="", **outcome))


def test_score_metrics_from_outcomes():
    samples = [
        _sample(0, 0.0, parse_ok=False, hacks=["torch_op"], error_kind="rule"),
        _sample(1, 0.0, parse_ok=True, compiled=False, error_kind="compile_error"),
        _sample(2, 1.1, parse_ok=True, compiled=True, correct=True, speedup=0.8),
        _sample(3, 2.3, parse_ok=True, compiled=True, correct=True, speedup=2.0),
    ]
    m = score_metrics(samples)
    assert m["kernel/parse_ok"] == 0.75 and m["kernel/compiled"] == 0.5 and m["kernel/correct"] == 0.5
    assert m["kernel/speedup_mean"] == pytest.approx(1.4)
    assert m["kernel/fast_1"] == 0.25
    assert m["hack/torch_op"] == 0.25 and m["error/compile_error"] == 0.25


def test_pass_at_k_is_the_unbiased_estimator():
    for n, c, k in itertools.product(range(1, 9), range(0, 9), range(1, 9)):
        if c > n or k > n:
            continue
        exact = 1.0 - comb(n - c, k) / comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    # it is the probability over random k-subsets
    rng = random.Random(0)
    attempts = [True] * 3 + [False] * 7
    hits = sum(any(rng.sample(attempts, 4)) for _ in range(20000)) / 20000
    assert abs(hits - pass_at_k(10, 3, 4)) < 0.02


def test_summarize_best_avg_fast():
    attempts = [("a", True, 2.0), ("a", False, None), ("b", True, 0.5), ("b", True, 0.9),
                ("c", False, None), ("c", False, None)]
    m = summarize(attempts, ks=(1, 2), fast_ps=(0.0, 1.0))
    assert m["eval/pass@1"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert m["eval/pass@2"] == pytest.approx(2 / 3)
    assert m["eval/best_speedup"] == pytest.approx((2.0 + 0.9 + 0) / 3)
    assert m["eval/avg_speedup"] == pytest.approx((1.0 + 0.7 + 0) / 3)
    assert m["eval/fast_0"] == pytest.approx(2 / 3) and m["eval/fast_1"] == pytest.approx(1 / 3)


class _FakeTrainerSave:
    """Writes what TrainerGroup.save writes, without a model (the real one is tested end to end)."""

    def save(self, d):
        Path(d, "model").mkdir()
        Path(d, "optimizer.pt").write_bytes(b"x")


def test_checkpoint_rename_keep_and_resume(tmp_path):
    root = tmp_path / "ckpt"
    for step in (2, 4, 6):
        checkpoint.save(root, step, _FakeTrainerSave(), {"cursor": step + 1}, keep_last=2)
    assert [s for s, _ in checkpoint.list_checkpoints(root)] == [4, 6]
    (root / ".tmp_step_000008_1").mkdir()  # a crashed write is never picked up
    last = checkpoint.resolve_resume("auto", root)
    assert last.name == "step_000006" and checkpoint.load_loop_state(last)["cursor"] == 7
    assert checkpoint.resolve_resume("never", root) is None
    with pytest.raises(FileNotFoundError, match="resume="):
        checkpoint.resolve_resume(str(tmp_path / "nope"), root)
