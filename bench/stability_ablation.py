"""The stability ablation: the laptop default for N seeds, base (a group split across the two
optimiser steps, the old planner) vs fix (mini-batches by group), the same seeds in both arms.

    python -m bench.stability_ablation --seeds 0 1 2 --steps 8 [--arms base fix]

Each run is ``python -m pipeline.main +experiment=kernel_multiturn profile=laptop`` with
``pipeline.seed``, ``trainer.seed`` and ``rollout.engine.hf.seed`` set to the seed (the sampler's
draws are seeded, but which requests share a ``generate`` call and the sandbox's timings are not,
so two runs of one seed can still differ). Writes bench/baselines/cpu/stability_ablation.json after
every run: per run the score and correct share per step, whether it collapsed (a step with no
correct answer after one with >= 50 %), and the rise bar (last two steps' mean reward >= first
two + 0.15).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"base": ["algorithm.mini_batch_by_group=false"], "fix": ["algorithm.mini_batch_by_group=true"]}


def summarise(lines: list[dict]) -> dict:
    reward = [m.get("critic/score/mean", 0.0) for m in lines]
    correct = [m.get("kernel/correct", float("nan")) for m in lines]
    peaked = False
    collapsed_at = None
    for i, c in enumerate(correct):
        if c == c and peaked and c == 0 and collapsed_at is None:
            collapsed_at = i
        peaked = peaked or (c == c and c >= 0.5)
    first = sum(reward[:2]) / max(1, len(reward[:2]))
    last = sum(reward[-2:]) / max(1, len(reward[-2:]))
    return {"reward": reward, "correct": correct, "collapsed_at": collapsed_at,
            "first_two": first, "last_two": last, "meets_bar": len(reward) >= 4 and last >= first + 0.15,
            "grad_norm": [m.get("actor/grad_norm") for m in lines],
            "kl": [m.get("rollout_corr/kl") for m in lines]}


def run_one(arm: str, seed: int, steps: int, out: Path, extra: list[str]) -> dict:
    run_dir = out / f"{arm}_s{seed}"
    cmd = [sys.executable, "-m", "pipeline.main", "+experiment=kernel_multiturn", "profile=laptop",
           "logger=console", "pipeline.progress=false", "checkpoint.at_end=false",
           f"pipeline.steps={steps}", f"pipeline.seed={seed}", f"trainer.seed={seed}",
           f"rollout.engine.hf.seed={seed}", f"name=ablation_{arm}_s{seed}", f"hydra.run.dir={run_dir}",
           *ARMS[arm], *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - t0
    (run_dir).mkdir(parents=True, exist_ok=True)
    (run_dir / "stderr.txt").write_text(proc.stderr[-20000:])
    metrics = run_dir / "metrics.jsonl"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return {"arm": arm, "seed": seed, "rc": proc.returncode, "wall_s": round(wall, 1),
            "command": " ".join(cmd[1:]), **summarise(lines)}


def table(doc: dict) -> str:
    """The runs as a markdown table (docs/algorithms.md "Stability")."""
    rows = ["| seed | arm | correct share per step | largest fall from the best so far | reward first two -> last two | fell to 0 after >= 50 % |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in sorted(doc["runs"], key=lambda r: (r["seed"], r["arm"])):
        corr = " ".join(f"{c:.2f}" for c in r["correct"])
        c = r["correct"]
        fall = max([max(c[:i]) - c[i] for i in range(1, len(c))] + [0.0])
        rows.append(f"| {r['seed']} | {r['arm']} | {corr} | {fall:.2f} | {r['first_two']:.3f} -> {r['last_two']:.3f}"
                    f" ({'meets' if r['meets_bar'] else 'misses'} +0.15) | "
                    f"{'step ' + str(r['collapsed_at']) if r['collapsed_at'] is not None else 'no'} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", action="store_true", help="print the stored runs as a table and stop")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--arms", nargs="+", default=["base", "fix"])
    ap.add_argument("--out", default="/tmp/stability_ablation")
    ap.add_argument("--json", default=str(ROOT / "bench/baselines/cpu/stability_ablation.json"))
    ap.add_argument("extra", nargs="*", help="more Hydra overrides for every run")
    a = ap.parse_args()
    out = Path(a.out)
    path = Path(a.json)
    doc = json.loads(path.read_text()) if path.exists() else {"runs": []}
    if a.table:
        print(table(doc))
        return
    doc.update({"machine": f"{os.cpu_count()}-core CPU box (shared)", "steps": a.steps})
    for seed in a.seeds:          # base and fix of one seed back to back: the same load
        for arm in a.arms:
            r = run_one(arm, seed, a.steps, out, a.extra)
            r["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            doc["runs"] = [x for x in doc["runs"] if (x["arm"], x["seed"]) != (arm, seed)] + [r]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc, indent=1) + "\n")
            print(json.dumps({k: r[k] for k in ("arm", "seed", "rc", "wall_s", "reward", "correct",
                                                "collapsed_at", "meets_bar")}), flush=True)


if __name__ == "__main__":
    main()
