"""One config, two schedules: ``pipeline.mode=sync`` then ``pipeline.mode=one_off``, each a full
``pipeline.main`` session (Ray, sampler pool, FSDP2 trainer, weight sync, metrics), side by side.

Per mode, means over the steps after the first (the first pays for warm-up and, in one_off, has
no overlap yet): step time, T_gen (to the batch's last token), reward tail, T_gen+reward,
T_train, T_sync, efficiency = (max(T_gen+reward, T_train) + T_sync) / measured step. Then the
speedup of one_off over sync against its bound from sync's own parts:
(T_gen+reward + T_train + T_sync) / (max(T_gen+reward, T_train) + T_sync).

Any Hydra override after ``--`` is applied to both runs, e.g.

    python -m bench.pipeline --steps 4 -- +experiment=toy
    python -m bench.pipeline --steps 4 -- +experiment=toy resources=one_gpu model.tiny.hidden_size=896 ...
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import parser, progress, report

CONF = Path(__file__).resolve().parents[1] / "conf"
KEYS = {"step_s": "timing/step", "gen_s": "timing/gen", "reward_tail_s": "timing/reward_tail",
        "gen_plus_reward_s": "timing/gen_total", "train_s": "timing/train", "sync_s": "timing/weight_sync",
        "efficiency": "pipeline/efficiency", "policy_lag": "pipeline/policy_lag"}


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pipeline.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def run_mode(mode: str, overrides: list[str], run_dir: Path) -> tuple[list[dict[str, float]], float]:
    from omegaconf import OmegaConf

    from pipeline.config import check
    from pipeline.main import Session

    cfg = compose(overrides + [f"pipeline.mode={mode}", f"name=bench_{mode}", "resume=never"])
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


def summarise(mode: str, history: list[dict[str, float]], wall: float) -> dict[str, Any]:
    # Step 0 pays for warm-up; one_off's last step has no next batch to generate (its gen is 0),
    # so both ends are left out of the means, for both modes alike.
    steady = history[1:-1] if len(history) > 2 else (history[1:] or history)
    row: dict[str, Any] = {"mode": mode, "steps": len(history), "wall_s": wall}
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
    p.add_argument("--modes", default="sync,one_off")
    p.add_argument("--summarise", default="", help="no run: summarise the histories of this earlier --out file")
    args = p.parse_args(own)
    overrides = [f"pipeline.steps={args.steps}", "logger=console", "pipeline.progress=false",
                 "checkpoint.every=0", "checkpoint.at_end=false"] + extra_over
    rows, histories = [], {}
    if args.summarise:
        earlier = json.loads(Path(args.summarise).read_text())
        overrides = earlier["overrides"].split()
        walls = {r["mode"]: r["wall_s"] for r in earlier["rows"]}
        histories = earlier["history"]
        rows = [summarise(mode, h, walls[mode]) for mode, h in histories.items()]
    else:
        for mode in args.modes.split(","):
            run_dir = Path(args.run_root) / f"{mode}-{int(time.time())}"
            history, wall = run_mode(mode, overrides, run_dir)
            histories[mode] = history
            rows.append(summarise(mode, history, wall))
            progress("pipeline", rows[-1])
    extra: dict[str, Any] = {"overrides": " ".join(overrides)}
    if args.summarise:  # the numbers are the earlier run's, not this machine's
        extra["measured_on"] = earlier["machine"]
        extra["summarised_from"] = args.summarise
    by = {r["mode"]: r for r in rows}
    if "sync" in by and "one_off" in by:
        s, o = by["sync"], by["one_off"]
        bound = (s["gen_plus_reward_s"] + s["train_s"] + s["sync_s"]) / \
                (max(s["gen_plus_reward_s"], s["train_s"]) + s["sync_s"])
        extra["speedup_one_off_over_sync"] = s["step_s"] / o["step_s"]
        extra["speedup_bound"] = bound
        extra["speedup_share_of_bound"] = (extra["speedup_one_off_over_sync"] - 1) / (bound - 1) \
            if bound > 1 else float("nan")
    report("pipeline", args, rows, {**extra, "history": histories},
           columns=["mode", "steps", "step_s", "gen_s", "reward_tail_s", "gen_plus_reward_s", "train_s",
                    "sync_s", "efficiency", "policy_lag", "reward_mean", "wall_s"])


if __name__ == "__main__":
    main()
