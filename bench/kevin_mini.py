"""Kevin in miniature's result: the base model against the RL checkpoint on held-out tasks.

Reads two sample files of ``bench.model_baseline`` (``--samples``: one JSON line per scored turn),
one of the base model and one of the RL checkpoint, on the same held-out tasks with the same k and
turns, and the RL run's ``metrics.jsonl``; writes one JSON with, for ``base`` and ``rl``:
``correct_rate``, ``fast1``, ``compiled_rate`` (per scored turn, every turn counted),
``mean_speedup_correct``, ``per_turn_correct`` (turn 1..T), plus ``diff_correct_ci95`` (rl - base,
a 95 % bootstrap interval over tasks and, within each drawn task, over its trajectories) and the
run's curve with the no-collapse check.

    python -m bench.kevin_mini --base base.jsonl --rl rl.jsonl --metrics run/metrics.jsonl \
        --model qwen2.5-coder-1.5b-instruct --out bench/baselines/h100/kevin_mini.json

The bootstrap is written here: it resamples a two-level structure (tasks, then trajectories of a
task, all turns of a trajectory kept together) that scipy.stats.bootstrap's independent-sample
resampling does not express.
"""
from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

CORRECT_KEY = "kernel/correct"     # pipeline metrics: the step's correct share
SCORE_KEY = "critic/score/mean"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rates(rows: list[dict[str, Any]], turns: int) -> dict[str, Any]:
    """The issue's per-model figures from sample rows (``task``, ``traj``, ``turn`` from 0,
    ``compiled``, ``correct``, ``speedup``): bench.model_baseline's rates under the issue's names."""
    from bench.model_baseline import row_rates

    every = row_rates(rows)
    if not every["n"]:
        return {"n": 0}
    per_turn = [row_rates([r for r in rows if r["turn"] == t]) for t in range(turns)]
    return {"n": every["n"], "tasks": len({r["task"] for r in rows}),
            "correct_rate": every["correct"], "fast1": every["fast_1"], "compiled_rate": every["compiled"],
            "mean_speedup_correct": every["mean_speedup_correct"],
            "per_turn_correct": [p["correct"] if p["n"] else None for p in per_turn]}


def _by_task(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, int]]]:
    """task -> one (correct turns, scored turns) pair per trajectory."""
    acc: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for r in rows:
        c = acc[r["task"]][r["traj"]]
        c[0] += bool(r.get("correct"))
        c[1] += 1
    return {task: [tuple(v) for v in trajs.values()] for task, trajs in acc.items()}


def diff_ci95(base: list[dict[str, Any]], rl: list[dict[str, Any]], draws: int = 2000,
              seed: int = 0) -> list[float]:
    """95 % interval of correct_rate(rl) - correct_rate(base): each draw resamples the tasks (the
    same draw for both models) and, within each drawn task, each model's trajectories."""
    b, r = _by_task(base), _by_task(rl)
    tasks = sorted(set(b) & set(r))
    if not tasks:
        raise ValueError("the two sample files share no task")
    rng = random.Random(seed)

    def rate(trajs_of: dict[str, list[tuple[int, int]]], picked: list[str]) -> float:
        hit = seen = 0
        for task in picked:
            trajs = trajs_of[task]
            for _ in trajs:
                c, n = trajs[rng.randrange(len(trajs))]
                hit, seen = hit + c, seen + n
        return hit / seen if seen else 0.0

    diffs = []
    for _ in range(draws):
        picked = [tasks[rng.randrange(len(tasks))] for _ in tasks]
        diffs.append(rate(r, picked) - rate(b, picked))
    diffs.sort()
    return [round(diffs[int(0.025 * (draws - 1))], 4), round(diffs[int(0.975 * (draws - 1))], 4)]


def collapse(correct: list[float], run: int = 3) -> int | None:
    """The first step of ``run`` steps in a row whose correct share is below half its running best
    (the best of the steps before it), or None: the issue's collapse."""
    best, below = None, 0
    for i, c in enumerate(correct):
        if best is not None and best > 0 and c < best / 2:
            below += 1
            if below == run:
                return i - run + 1
        else:
            below = 0
        best = c if best is None else max(best, c)
    return None


def curve(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    correct = [float(m.get(CORRECT_KEY, 0.0)) for m in metrics]
    return {"steps": len(metrics), "correct": [round(c, 4) for c in correct],
            "score": [round(float(m.get(SCORE_KEY, 0.0)), 4) for m in metrics],
            "collapsed_at": collapse(correct)}


def result(base: list[dict[str, Any]], rl: list[dict[str, Any]], metrics: list[dict[str, Any]],
           turns: int, **meta: Any) -> dict[str, Any]:
    rb, rr = rates(base, turns), rates(rl, turns)
    ci = diff_ci95(base, rl)
    run = curve(metrics)
    pt = rr.get("per_turn_correct") or []
    bars = {"heldout_above_base": ci[0] > 0,
            "turn_last_above_turn1": len(pt) >= 2 and None not in (pt[0], pt[-1]) and pt[-1] > pt[0],
            "no_collapse_40_steps": run["steps"] >= 40 and run["collapsed_at"] is None}
    return {**meta, "holdout_tasks": sorted({r["task"] for r in base}), "steps": run["steps"],
            "base": rb, "rl": rr, "diff_correct_ci95": ci, "curve": run, "bars": bars}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="bench.model_baseline --samples of the base model")
    ap.add_argument("--rl", required=True, help="the same, of the RL checkpoint")
    ap.add_argument("--metrics", required=True, help="the RL run's metrics.jsonl")
    ap.add_argument("--model", default="", help="the base model's name")
    ap.add_argument("--train-tasks", default="", help="comma-separated task ids the run trained on")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    res = result(read_jsonl(a.base), read_jsonl(a.rl), read_jsonl(a.metrics), a.turns, model=a.model,
                 train_tasks=[t for t in a.train_tasks.split(",") if t])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    for k in ("base", "rl"):
        m = res[k]
        print(f"{k}: correct {m['correct_rate']:.3f} compiled {m['compiled_rate']:.3f} fast1 {m['fast1']:.3f} "
              f"per turn {m['per_turn_correct']}")
    print(f"diff correct 95% CI {res['diff_correct_ci95']}; steps {res['steps']}, collapsed at "
          f"{res['curve']['collapsed_at']}; bars {res['bars']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
