"""Kevin's test-time beam search: ranking and copying, histories handed on, per-budget metrics
(pure, on hand-built Samples), and ``pipeline.evaluate`` with ``evaluate.search=beam`` on
ToyEnv's holdout split through the real sampler side."""
import json

import pytest

from pipeline.beam import (Best, beam_metrics, check_beam, lineage_bests, next_starts,
                           rank, select_parents)
from pipeline.evaluate_config import BeamConfig
from pipeline.rollout import Start, build_prompt, turn_of
from pipeline.sample import Sample
from rewards.interface import Turn, TurnOutcome
from tests.pipeline.test_e2e import config


def _s(task, traj, turn, correct, speedup=None, score=None, rnd=0, parent=None, error=None):
    return Sample(uid=f"0/{task}/{traj}/{turn}", step=0, task_id=task, traj=traj, turn=turn,
                  prompt_ids=[1], response_ids=[2], logprobs=[-1.0], finish_reason="stop",
                  score=(1.0 if correct else 0.0) if score is None else score, policy_version=0,
                  outcome=TurnOutcome(score=0.0, correct=correct, speedup=speedup, summary=f"s{traj}.{turn}",
                                      answer=f"a{traj}.{turn}", feedback=f"f{traj}.{turn}"),
                  error=error, round=rnd, parent=parent)


def test_rank_puts_the_fastest_correct_first_and_breaks_ties_by_score_then_index():
    bests = {0: Best(False, 0.0, 0.9),   # high score but nothing correct: last
             1: Best(True, 1.2, 0.1),
             2: Best(True, 2.0, 0.5),
             3: Best(True, 2.0, 0.5),    # tie with 2: the lower index first
             4: Best(True, 2.0, 0.7),    # same speedup, higher score: before 2 and 3
             5: Best(True, 0.0, 0.8)}    # correct without a timing: after every timed one
    assert rank(bests) == [4, 2, 3, 1, 5, 0]
    assert select_parents(bests, width=6, keep=2) == [4, 4, 4, 2, 2, 2]
    assert select_parents(bests, width=6, keep=6) == [4, 2, 3, 1, 5, 0]
    assert select_parents({j: Best() for j in range(4)}, width=4, keep=2) == [0, 0, 1, 1]


def test_next_round_continues_the_kept_histories_with_turn_ids_going_on():
    beam = BeamConfig(width=4, keep=2, turns_per_round=2, rounds=3)
    r0 = [_s("a", 0, 0, False), _s("a", 0, 1, True, 1.5),
          _s("a", 1, 0, True, 3.0), _s("a", 1, 1, False, error="generation timed out"),
          _s("a", 2, 0, False), _s("a", 2, 1, False),
          _s("a", 3, 0, True, 0.5), _s("a", 3, 1, False)]
    starts = next_starts(r0, {}, ["a"], 0, beam)
    assert [starts[("a", j)].parent for j in range(4)] == [1, 1, 0, 0]
    for j in range(4):
        st = starts[("a", j)]
        assert st.round == 1 and st.first_turn == 2
    # the error turn ended trajectory 1: it is not part of the history (as in the rollout)
    assert starts[("a", 0)].history == [Turn("s1.0", "a1.0", "f1.0")]
    assert starts[("a", 2)].history == [turn_of(r0[0]), turn_of(r0[1])]
    # round 1: a child's lineage keeps its ancestors' turns; round 2's histories grow
    r1 = [_s("a", j, t, False, rnd=1, parent=starts[("a", j)].parent) for j in range(4) for t in (2, 3)]
    r1[4] = _s("a", 2, 2, True, 4.0, rnd=1, parent=0)
    starts2 = next_starts(r0 + r1, starts, ["a"], 1, beam)
    assert [starts2[("a", j)].parent for j in range(4)] == [2, 2, 0, 0]  # 4.0, then 3.0 (inherited)
    assert starts2[("a", 0)].first_turn == 4 and starts2[("a", 0)].round == 2
    assert [t.feedback for t in starts2[("a", 0)].history] == ["f0.0", "f0.1", "f2.2", "f2.3"]
    assert [t.feedback for t in starts2[("a", 2)].history] == ["f1.0", "f0.2", "f0.3"]


def test_per_budget_metrics_take_each_lineage_best():
    beam = BeamConfig(width=2, keep=1, turns_per_round=1, rounds=2)
    samples = [
        _s("a", 0, 0, True, 2.0), _s("a", 1, 0, False),           # a, round 0: best 2.0
        _s("a", 0, 1, False, rnd=1, parent=0),                     # inherits 2.0
        _s("a", 1, 1, True, 5.0, rnd=1, parent=0),                 # improves to 5.0
        _s("b", 0, 0, False), _s("b", 1, 0, True, 0.5),            # b, round 0: best 0.5
        _s("b", 0, 1, False, rnd=1, parent=1), _s("b", 1, 1, False, rnd=1, parent=1),
        _s("c", 0, 0, False), _s("c", 1, 0, False),                # c: nothing correct ever
        _s("c", 0, 1, False, rnd=1, parent=0), _s("c", 1, 1, False, rnd=1, parent=0)]
    bests = lineage_bests(samples)
    assert bests[("a", 1, 0)] == Best(True, 2.0, 1.0) and bests[("b", 1, 1)].speedup == 0.5
    m = beam_metrics(samples, beam, ks=[1, 2], fast_ps=[0.0, 1.0])
    assert m["eval/beam/best_speedup/budget_1"] == pytest.approx((2.0 + 0.5 + 0.0) / 3)
    assert m["eval/beam/best_speedup/budget_2"] == pytest.approx((5.0 + 0.5 + 0.0) / 3)
    assert m["eval/beam/median_best_speedup/budget_1"] == pytest.approx(0.5)
    assert m["eval/beam/median_best_speedup/budget_2"] == pytest.approx(0.5)
    assert m["eval/beam/best_correct/budget_1"] == pytest.approx(2 / 3)
    assert m["eval/beam/pass@1/budget_1"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert m["eval/beam/pass@1/budget_2"] == pytest.approx((1.0 + 1.0 + 0) / 3)  # both inherit
    assert m["eval/beam/avg_speedup/budget_2"] == pytest.approx(((2.0 + 5.0) / 2 + 0.5) / 3)
    assert m["eval/beam/fast_1/budget_1"] == pytest.approx(1 / 3)
    assert m["eval/beam/best_score/budget_2"] == pytest.approx(2 / 3)
    assert m["eval/beam/tasks"] == 3 and m["eval/beam/attempts_per_task"] == 2
    assert m["eval/samples"] == 12


def test_bad_beam_values_name_the_key():
    ok = BeamConfig(width=4, keep=2, turns_per_round=1, rounds=1)
    assert check_beam(ok, [1, 4]) == []
    assert any("evaluate.beam.width=4" in e and "multiple" in e
               for e in check_beam(BeamConfig(4, 3, 1, 1), [1]))
    assert any("evaluate.beam.keep=5" in e for e in check_beam(BeamConfig(4, 5, 1, 1), [1]))
    assert any("evaluate.beam.rounds=0" in e for e in check_beam(BeamConfig(4, 2, 1, 0), [1]))
    assert any("evaluate.ks" in e for e in check_beam(ok, [8]))


@pytest.mark.slow
def test_beam_search_cli_on_toy_holdout(ray_local, tmp_path):
    from pipeline.evaluate import run_samples
    from pipeline.models import load_model_config, load_tokenizer
    from rewards.toy import ToyEnv

    beam = ["evaluate.search=beam", "evaluate.beam.width=4", "evaluate.beam.keep=2",
            "evaluate.beam.turns_per_round=2", "evaluate.beam.rounds=2", "evaluate.ks=[1,4]"]
    with pytest.raises(ValueError, match="evaluate.beam.width=4: expected a multiple"):
        run_samples(config("+experiment=toy", *beam, "evaluate.beam.keep=3"), tmp_path)
    samples, metrics = run_samples(config("+experiment=toy", *beam), tmp_path)
    assert json.loads((tmp_path / "eval.json").read_text()) == metrics
    assert len({s.uid for s in samples}) == len(samples) == 2 * 4 * 2 * 2
    assert {s.turn for s in samples if s.round == 0} == {0, 1}
    assert {s.turn for s in samples if s.round == 1} == {2, 3}
    assert all(s.parent is None for s in samples if s.round == 0)
    env, tok = ToyEnv(), load_tokenizer(load_model_config("tiny"))
    tasks = {t.task_id: t for t in env.tasks("holdout")}
    bests = lineage_bests(samples)
    for task in tasks:
        parents = select_parents({j: bests[(task, 0, j)] for j in range(4)}, width=4, keep=2)
        for j in range(4):
            child = [s for s in samples if (s.task_id, s.round, s.traj) == (task, 1, j)]
            assert child[0].parent == parents[j]
            parent = sorted((s for s in samples if (s.task_id, s.round, s.traj) == (task, 0, parents[j])),
                            key=lambda s: s.turn)
            # the child's first prompt is its parent's conversation after 2 turns, feedback included
            assert child[0].prompt_ids == build_prompt(
                tok, env.messages(tasks[task], [turn_of(s) for s in parent]))
            assert parent[-1].outcome.feedback in tok.decode(child[0].prompt_ids)
    for budget in (2, 4):
        for key in ("best_speedup", "median_best_speedup", "best_correct", "pass@1", "pass@4",
                    "fast_1"):
            assert f"eval/beam/{key}/budget_{budget}" in metrics, (key, budget)
    # the best trajectory is always kept: what was solved by turn 2 stays solved by turn 4
    assert metrics["eval/beam/best_correct/budget_4"] >= metrics["eval/beam/best_correct/budget_2"]
    # ToyEnv has no speedups (correct = score > 0): the ranking falls to the score, the top one stays
    assert metrics["eval/beam/best_score/budget_4"] >= metrics["eval/beam/best_score/budget_2"] > 0
    assert metrics["eval/beam/pass@1/budget_2"] <= metrics["eval/beam/pass@4/budget_2"] <= 1.0
