"""One config, several staleness bounds: ``pipeline.max_staleness=k`` for each k of ``--ks``
(default 0,1,2; 0 is the sync schedule, 1 one_off), each a full ``pipeline.main`` session (Ray,
sampler pool, FSDP2 trainer, weight sync, metrics), side by side.

Per k, means over the steps after the first (the first pays for warm-up and, for k > 0, has
no overlap yet): step time, T_gen (to the batch's last token), reward tail, T_gen+reward,
T_train, T_sync, efficiency = (max(T_gen+reward, T_train) + T_sync) / measured step, policy lag.
Then the speedup of each k over k = 0 against the one-off bound from k = 0's own parts:
(T_gen+reward + T_train + T_sync) / (max(T_gen+reward, T_train) + T_sync). Each run's timeline
(pipeline/timeline.py) is copied to ``<run-root>/timeline_k<k>.png``.

Any Hydra override after ``--`` is applied to both runs, e.g.

    python -m bench.pipeline --steps 4 -- +experiment=toy
    python -m bench.pipeline --steps 4 -- +experiment=toy resources=one_gpu model.tiny.hidden_size=896 ...
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import parser, progress, report

CONF = Path(__file__).resolve().parents[1] / "conf"
KEYS = {"step_s": "timing/step", "gen_s": "timing/gen", "reward_tail_s": "timing/reward_tail",
        "gen_plus_reward_s": "timing/gen_total", "train_s": "timing/train", "sync_s": "timing/weight_sync",
        "efficiency": "pipeline/efficiency", "policy_lag": "pipeline/policy_lag",
        "policy_lag_max": "pipeline/policy_lag_max", "dropped": "staleness/dropped_samples"}


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pipeline.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def run_k(k: int, overrides: list[str], run_dir: Path) -> tuple[list[dict[str, float]], float]:
    from omegaconf import OmegaConf

    from pipeline.config import check
    from pipeline.main import Session

    cfg = compose(overrides + [f"pipeline.max_staleness={k}", f"name=bench_k{k}", "resume=never"])
    OmegaConf.resolve(cfg)
    resolved = OmegaConf.to_container(cfg)
    conf = cfg  # a DictConfig, as pipeline.main.run keeps it (unused groups may hold MISSING)
    check(conf)
    session = Session(conf, run_dir, resolved)
    try:
        t0 = time.perf_counter()
        history = asyncio.run(session.loop.run())
        return history, time.perf_counter() - t0
    finally:
        session.close()


def summarise(k: int, history: list[dict[str, float]], wall: float) -> dict[str, Any]:
    # Step 0 pays for warm-up; for k > 0 the last steps have no next batch to generate (their gen
    # is 0), so both ends are left out of the means, for every k alike.
    steady = history[1:-1] if len(history) > 2 else (history[1:] or history)
    from pipeline.staleness import schedule_name

    row: dict[str, Any] = {"k": k, "schedule": schedule_name(k), "steps": len(history), "wall_s": wall}
    for name, key in KEYS.items():
        vals = [h[key] for h in steady if key in h]
        row[name] = sum(vals) / len(vals) if vals else float("nan")
    row["reward_mean"] = history[-1].get("reward/mean", float("nan")) if history else float("nan")
    return row


def main() -> None:
    argv = sys.argv[1:]
    extra_over = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--run-root", default="runs/bench_pipeline")
    p.add_argument("--ks", default="0,1,2", help="pipeline.max_staleness values, in run order")
    p.add_argument("--summarise", default="", help="no run: summarise the histories of this earlier --out file")
    args = p.parse_args(own)
    overrides = [f"pipeline.steps={args.steps}", "logger=console", "pipeline.progress=false",
                 "checkpoint.every=0", "checkpoint.at_end=false"] + extra_over
    rows, histories = [], {}
    if args.summarise:
        earlier = json.loads(Path(args.summarise).read_text())
        overrides = earlier["overrides"].split()
        from pipeline.staleness import MODE_STALENESS

        def k_of(key: Any) -> int:  # files written before max_staleness named rows by mode
            return MODE_STALENESS[key] if key in MODE_STALENESS else int(key)

        walls = {k_of(r.get("k", r.get("mode"))): r["wall_s"] for r in earlier["rows"]}
        histories = {str(k_of(k)): h for k, h in earlier["history"].items()}
        rows = [summarise(int(k), h, walls[int(k)]) for k, h in histories.items()]
    else:
        for k in [int(x) for x in args.ks.split(",")]:
            run_dir = Path(args.run_root) / f"k{k}-{int(time.time())}"
            history, wall = run_k(k, overrides, run_dir)
            histories[str(k)] = history
            rows.append(summarise(k, history, wall))
            if (run_dir / "timeline.png").exists():
                shutil.copy(run_dir / "timeline.png", Path(args.run_root) / f"timeline_k{k}.png")
            progress("pipeline", rows[-1])
    extra: dict[str, Any] = {"overrides": " ".join(overrides)}
    if args.summarise:  # the numbers are the earlier run's, not this machine's
        extra["measured_on"] = earlier["machine"]
        extra["summarised_from"] = args.summarise
    by = {r["k"]: r for r in rows}
    if 0 in by:
        s = by[0]
        bound = (s["gen_plus_reward_s"] + s["train_s"] + s["sync_s"]) / \
                (max(s["gen_plus_reward_s"], s["train_s"]) + s["sync_s"])
        extra["speedup_bound_one_off"] = bound
        for k, r in by.items():
            if k:
                extra[f"speedup_k{k}_over_k0"] = s["step_s"] / r["step_s"]
    report("pipeline", args, rows, {**extra, "history": histories},
           columns=["k", "schedule", "steps", "step_s", "gen_s", "reward_tail_s", "gen_plus_reward_s",
                    "train_s", "sync_s", "efficiency", "policy_lag", "policy_lag_max", "dropped", "reward_mean",
                    "wall_s"])


if __name__ == "__main__":
    main()
