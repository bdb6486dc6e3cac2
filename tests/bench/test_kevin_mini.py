"""bench.kevin_mini: the result's figures, the bootstrap interval and the collapse rule."""
import json

from bench import kevin_mini


def _rows(correct_by_task: dict[str, list[list[bool]]]) -> list[dict]:
    # task -> trajectories -> turns (correct or not); a correct turn is compiled and 1.2x
    return [{"task": task, "traj": j, "turn": t, "compiled": c, "correct": c, "speedup": 1.2 if c else None}
            for task, trajs in correct_by_task.items() for j, turns in enumerate(trajs) for t, c in enumerate(turns)]


def test_rates_count_every_turn_and_each_turn_apart():
    rows = _rows({"L1/a": [[False, True], [False, False]], "L1/b": [[True, True], [False, True]]})
    r = kevin_mini.rates(rows, turns=2)
    assert r["n"] == 8 and r["tasks"] == 2
    assert r["correct_rate"] == 4 / 8 and r["fast1"] == 4 / 8 and r["compiled_rate"] == 4 / 8
    assert r["per_turn_correct"] == [1 / 4, 3 / 4]
    assert abs(r["mean_speedup_correct"] - 1.2) < 1e-9


def test_the_interval_excludes_zero_only_for_a_real_gain():
    tasks = [f"L1/t{i}" for i in range(12)]
    base = _rows({t: [[False] * 4 for _ in range(8)] for t in tasks})
    better = _rows({t: [[j % 2 == 0] * 4 for j in range(8)] for t in tasks})   # half the trajectories right
    same = _rows({t: [[False] * 4 for _ in range(8)] for t in tasks})
    lo, hi = kevin_mini.diff_ci95(base, better)
    assert 0 < lo <= 0.5 <= hi
    assert kevin_mini.diff_ci95(base, same) == [0.0, 0.0]
    # a gain on one task of twelve is not a gain over tasks: the interval reaches 0
    one = _rows({t: [[t == "L1/t0"] * 4 for _ in range(8)] for t in tasks})
    assert kevin_mini.diff_ci95(base, one)[0] <= 0.0


def test_collapse_is_three_steps_in_a_row_below_half_the_running_best():
    assert kevin_mini.collapse([0.1, 0.6, 0.2, 0.7, 0.2, 0.6]) is None        # dips of one step
    assert kevin_mini.collapse([0.1, 0.6, 0.29, 0.2, 0.1, 0.6]) == 2
    assert kevin_mini.collapse([0.0, 0.0, 0.0, 0.0]) is None                   # nothing to fall from
    assert kevin_mini.collapse([0.4, 0.3, 0.25, 0.2]) is None                  # half of 0.4 is 0.2: not below


def test_the_cli_writes_the_issue_fields(tmp_path):
    tasks = [f"L1/t{i}" for i in range(4)]
    base, rl = tmp_path / "base.jsonl", tmp_path / "rl.jsonl"
    base.write_text("\n".join(json.dumps(r) for r in _rows({t: [[False, False, False, True]] * 4 for t in tasks})))
    rl.write_text("\n".join(json.dumps(r) for r in _rows({t: [[False, True, True, True]] * 4 for t in tasks})))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps({"step": i, "kernel/correct": 0.1 + 0.01 * i, "critic/score/mean": 0.2})
                                 for i in range(40)))
    out = tmp_path / "kevin_mini.json"
    assert kevin_mini.main(["--base", str(base), "--rl", str(rl), "--metrics", str(metrics), "--model", "m",
                            "--train-tasks", "L1/x,L1/y", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    for key in ("model", "train_tasks", "holdout_tasks", "steps", "base", "rl", "diff_correct_ci95"):
        assert key in res, key
    for key in ("correct_rate", "fast1", "compiled_rate", "mean_speedup_correct", "per_turn_correct"):
        assert key in res["base"] and key in res["rl"], key
    assert res["holdout_tasks"] == tasks and res["train_tasks"] == ["L1/x", "L1/y"] and res["steps"] == 40
    assert res["rl"]["per_turn_correct"] == [0.0, 1.0, 1.0, 1.0]
    assert res["bars"] == {"heldout_above_base": True, "turn_last_above_turn1": True, "no_collapse_40_steps": True}
