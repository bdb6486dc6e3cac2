"""bench.model_baseline's per-sample rates and JSONL rows, read from Samples' TurnOutcomes."""
import json

from bench.model_baseline import sample_rates, sample_row
from pipeline.rollout import unscored
from pipeline.sample import Sample
from rewards.interface import TurnOutcome


def _s(turn, outcome):
    return Sample(uid=f"0/t/0/{turn}", step=0, task_id="t", traj=0, turn=turn, prompt_ids=[1], response_ids=[2, 3],
                  logprobs=[-0.1, -0.1], finish_reason="stop", score=0.0, policy_version=0, outcome=outcome)


def test_rates_error_kinds_and_rows_come_from_the_outcomes():
    samples = [_s(0, TurnOutcome(score=0.0, feedback="no", parse_ok=True, error_kind="compile_error")),
               _s(1, TurnOutcome(score=2.0, feedback="ok", parse_ok=True, compiled=True, correct=True, speedup=2.0)),
               _s(1, TurnOutcome(score=0.0, feedback="", hacks=["torch_op"], error_kind="rule_violation")),
               _s(0, unscored()), _s(0, None)]
    r = sample_rates(samples, turns=2)
    assert r["all"]["n"] == 5 and r["all"]["parsed"] == 0.4 and r["all"]["correct"] == 0.2
    assert r["all"]["fast_1"] == 0.2 and r["all"]["max_speedup_correct"] == 2.0
    assert r["per_turn"]["2"]["correct"] == 0.5
    assert r["error_kinds"] == {"compile_error": 1, "correct": 1, "rule_violation": 1, "pipeline_error": 1,
                                "none": 1}
    assert r["rules_broken"] == {"torch_op": 1}
    assert r["per_task"]["t"] == {"samples": 5, "compiled": 1, "correct": 1, "best_speedup": 2.0}
    row = json.loads(json.dumps(sample_row(samples[1])))
    assert (row["correct"], row["speedup"], row["feedback"], row["hacks"]) == (True, 2.0, "ok", [])
    assert sample_row(samples[4])["correct"] is None and sample_row(samples[4])["feedback"] == ""
