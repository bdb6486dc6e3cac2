"""One config, several staleness bounds: ``pipeline.max_staleness=k`` for each k of ``--ks``
(default 0,1,2; 0 is the sync schedule, 1 one_off), each a full ``pipeline.main`` session (Ray,
sampler pool, FSDP2 trainer, weight push, metrics), side by side, k as a column.

Per k, means over the steady steps: the first step is left out (warm-up; for k > 0 nothing to
overlap yet) and so are the last max(1, k) (for k > 0 nothing is left to generate in them, so
their step is training alone; k = 0 drops its last one too, alike). Columns: step time and its
standard error over those steps, T_gen (to the batch's last token), the reward tail (last token
-> last score), T_gen+reward, T_train, T_push, efficiency = (max(T_gen+reward, T_train) + T_push)
/ measured step, one evaluation's p95 (a sample's last token -> its score) and the tail over it,
policy lag, and each pool's busy share of the steady window (union of its timeline spans).

Then, from k = 0's own phases: the balance (T_gen+reward / T_train: one-off pipelining pays only
when the two are close) and the one-off bound (T_gen+reward + T_train + T_push) / (max(T_gen+reward,
T_train) + T_push); for each k > 0 its speedup over k = 0, the speedup's noise (from the steps'
standard errors) and the share of the bound. Each run's timeline (pipeline/timeline.py) is copied
to ``<run-root>/timeline_k<k>.png`` (+ ``.jsonl``); the JSON is rewritten after each k, so a run
cut short keeps what it finished.

``--stored-answers``: the kernel env scores stored correct answers in place of the model's text
(bench/stored_answers.py: a random model's answers never parse, so the evaluator would otherwise
never run). Any Hydra override after ``--`` is applied to every run, e.g.

    python -m bench.pipeline --steps 6 -- +experiment=toy toy.delay_s=0.2
    python -m bench.pipeline --ks 0,1 --stored-answers -- +experiment=kernel_multiturn rollout=vllm ...  # bench/pipeline_vllm.sh
"""
from __future__ import annotations

import asyncio
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import fmt, machine, parser, progress, report, target

from pipeline.conf_files import CONF_DIR as CONF  # noqa: E402
KEYS = {"step_s": "timing_s/step", "gen_s": "timing_s/gen", "reward_tail_s": "timing_s/reward",
        "gen_plus_reward_s": "timing_s/gen_total", "train_s": "timing_s/train", "push_s": "timing_s/update_weights",
        "efficiency": "pipeline/efficiency", "eval_p95_s": "timing_s/score_p95",
        "policy_lag": "pipeline/policy_lag", "policy_lag_max": "pipeline/policy_lag_max",
        "dropped": "staleness/dropped_samples", "samples": "perf/samples", "correct": "kernel/correct",
        "errors": "sample/error_frac"}
LANES = ("sampler", "reward", "trainer", "push")
COLUMNS = ["k", "schedule", "steps", "steady", "step_s", "step_s_se", "gen_s", "reward_tail_s",
           "eval_p95_s", "tail_over_eval_p95", "gen_plus_reward_s", "train_s", "push_s", "efficiency",
           "policy_lag", "policy_lag_max", "dropped", "busy_sampler", "busy_reward", "busy_trainer",
           "busy_push", "samples", "correct", "errors", "reward_mean", "wall_s"]


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pipeline.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def run_k(k: int, overrides: list[str], run_dir: Path,
          env_factory: Any = None) -> tuple[list[dict[str, float]], float]:
    from omegaconf import OmegaConf

    from pipeline.config import check, check_required, resolved_profile
    from pipeline.main import Session, banner

    cfg = compose(overrides + [f"pipeline.max_staleness={k}", f"name=bench_k{k}", "resume=never"])
    check_required(cfg)
    print(banner(cfg, resolved_profile(cfg)), file=sys.stderr, flush=True)
    OmegaConf.resolve(cfg)
    resolved = OmegaConf.to_container(cfg)
    conf = cfg  # a DictConfig, as pipeline.main.run keeps it (unused groups may hold MISSING)
    check(conf)
    session = Session(conf, run_dir, resolved, env_factory=env_factory)
    try:
        t0 = time.perf_counter()
        history = asyncio.run(session.loop.run())
        return history, time.perf_counter() - t0
    finally:
        session.close()


def logged_history(path: Path) -> list[dict[str, float]]:
    """A run's metrics.jsonl (the same names and values as the history ``run_k`` returns): what is
    left of a run cut short (a device call's limit, a lost part) before it returned its history."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steady_steps(history: list[dict[str, float]], k: int) -> list[dict[str, float]]:
    """The steps a schedule's steady state is measured on (module docstring)."""
    steady = history[1:len(history) - max(1, k)]
    return steady or history[1:] or history


def busy_shares(timeline: Any, history: list[dict[str, float]], steady: list[dict[str, float]]) -> dict[str, float]:
    """Each lane's busy share of the steady window: from the end of the push before the first
    steady step to the end of the last steady step's push (the push closes every step)."""
    if timeline is None or not steady:
        return {}
    ends = {s.step: s.end for s in timeline.spans if s.lane == "push"}
    first, last = int(steady[0]["step"]), int(steady[-1]["step"])
    if first - 1 not in ends or last not in ends:
        return {}
    t0, t1 = ends[first - 1], ends[last]
    return {f"busy_{lane}": timeline.busy(lane, t0, t1) for lane in LANES}


def summarise(k: int, history: list[dict[str, float]], wall: float, timeline: Any = None) -> dict[str, Any]:
    from pipeline.staleness import schedule_name

    steady = steady_steps(history, k)
    row: dict[str, Any] = {"k": k, "schedule": schedule_name(k), "steps": len(history),
                           "steady": f"{int(steady[0]['step'])}-{int(steady[-1]['step'])}" if steady else "-",
                           "wall_s": wall}
    for name, key in KEYS.items():
        vals = [h[key] for h in steady if key in h]
        row[name] = sum(vals) / len(vals) if vals else float("nan")
    steps = [h["timing_s/step"] for h in steady if "timing_s/step" in h]
    row["step_s_se"] = statistics.stdev(steps) / math.sqrt(len(steps)) if len(steps) > 1 else float("nan")
    p95 = row["eval_p95_s"]
    row["tail_over_eval_p95"] = row["reward_tail_s"] / p95 if p95 and p95 == p95 else float("nan")
    row.update(busy_shares(timeline, history, steady))
    row["reward_mean"] = history[-1].get("critic/score/mean", float("nan")) if history else float("nan")
    return row


def compare(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Balance and bound from k = 0's phases; each k > 0's speedup, its noise, share of the bound."""
    by = {r["k"]: r for r in rows}
    if 0 not in by:
        return {}
    s = by[0]
    g, t, y = s["gen_plus_reward_s"], s["train_s"], s["push_s"]
    out: dict[str, Any] = {"sync_gen_plus_reward_s": g, "sync_train_s": t,
                           "sync_balance_ratio": max(g, t) / min(g, t) if min(g, t) > 0 else float("inf")}
    out["sync_balanced"] = out["sync_balance_ratio"] <= 1.5
    bound = (g + t + y) / (max(g, t) + y)
    out["speedup_bound_one_off"] = bound
    for k, r in sorted(by.items()):
        if not k:
            continue
        sp = s["step_s"] / r["step_s"]
        rel = math.sqrt((s["step_s_se"] / s["step_s"]) ** 2 + (r["step_s_se"] / r["step_s"]) ** 2)
        out[f"speedup_k{k}_over_k0"] = sp
        out[f"speedup_k{k}_noise"] = sp * rel
        out[f"speedup_k{k}_share_of_bound"] = sp / bound
        if k == 1:  # the bars for one_off
            out["bar_speedup_at_least_0.9_bound"] = target(sp >= 0.9 * bound)
            out["bar_speedup_not_above_bound_plus_noise"] = target(sp <= bound + sp * rel) \
                if rel == rel else "n/a"  # one steady step: no noise estimate
            out["bar_reward_tail_within_eval_p95"] = target(r["tail_over_eval_p95"] <= 1.0) \
                if r["tail_over_eval_p95"] == r["tail_over_eval_p95"] else "n/a"
    return out


def _balance_line(c: dict[str, Any]) -> None:
    if "sync_balance_ratio" in c:
        print(f"sync phases: gen+reward {fmt(c['sync_gen_plus_reward_s'])} s, train "
              f"{fmt(c['sync_train_s'])} s, ratio {fmt(c['sync_balance_ratio'])} "
              f"({'balanced' if c['sync_balanced'] else 'NOT balanced'}: target <= 1.5)", flush=True)


def _write(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2, default=str))


def main() -> None:
    argv = sys.argv[1:]
    extra_over = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--run-root", default="runs/bench_pipeline")
    p.add_argument("--ks", default="0,1,2", help="pipeline.max_staleness values, in run order")
    p.add_argument("--stored-answers", action="store_true",
                   help="kernel env: evaluate stored correct answers in place of the model's (random model)")
    p.add_argument("--answer-share", type=float, default=1.0,
                   help="with --stored-answers: share of evaluations given a stored answer (the evaluator's load)")
    p.add_argument("--answer-variants", type=int, default=1,
                   help="with --stored-answers: distinct builds per task (1: the build cache hits after the first)")
    p.add_argument("--answer-tasks", type=int, default=0,
                   help="with --stored-answers: only the first N answered tasks (N = pipeline.tasks_per_batch: "
                        "the same tasks every step, so every build after the first step is a cache hit)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="skip a k whose run (timed as the previous one, start-up included) would end past this")
    p.add_argument("--summarise", default="",
                   help="no run: summarise the histories of these earlier --out files (comma-separated: one "
                        "k per device call, same overrides), compared as if run side by side")
    args = p.parse_args(own)
    overrides = [f"pipeline.steps={args.steps}", "logger=console", "pipeline.progress=false",
                 "checkpoint.every=0", "checkpoint.at_end=false"] + extra_over
    rows, histories = [], {}
    root = Path(args.run_root)
    extra: dict[str, Any] = {"overrides": " ".join(overrides)}
    if args.stored_answers:
        extra["workload"] = (f"stored answers (bench/stored_answers.py): share {args.answer_share} of "
                             f"evaluations, {args.answer_variants} variant(s) per task"
                             f"{f', the first {args.answer_tasks} answered tasks' if args.answer_tasks else ''}")
    if args.summarise:
        files = [f for f in args.summarise.split(",") if f]
        earlier = [json.loads(Path(f).read_text()) for f in files]
        if len({e["overrides"] for e in earlier}) > 1:
            sys.exit(f"--summarise: {files} were run with different overrides; their k rows do not compare")
        overrides = earlier[0]["overrides"].split()
        extra = {"overrides": earlier[0]["overrides"], "measured_on": earlier[0]["machine"],
                 "summarised_from": files}  # the numbers are the earlier runs'
        if "workload" in earlier[0]:
            extra["workload"] = earlier[0]["workload"]
        from pipeline.staleness import MODE_STALENESS

        def k_of(key: Any) -> int:  # files written before max_staleness named rows by mode
            return MODE_STALENESS[key] if key in MODE_STALENESS else int(key)

        walls = {k_of(r.get("k", r.get("mode"))): r["wall_s"] for e in earlier for r in e["rows"]}
        histories = {str(k_of(k)): h for e in earlier for k, h in e["history"].items()}
        rows = [summarise(int(k), h, walls[int(k)]) for k, h in sorted(histories.items(), key=lambda kv: int(kv[0]))]
    else:
        from pipeline.timeline import Timeline

        factory = None
        if args.stored_answers:
            from bench.stored_answers import env_factory

            factory = env_factory(args.answer_share, args.answer_variants, args.answer_tasks)
        t_begin, last = time.perf_counter(), 0.0
        for k in [int(x) for x in args.ks.split(",")]:
            elapsed = time.perf_counter() - t_begin
            if args.budget_s and last and elapsed + last > args.budget_s:
                extra.setdefault("skipped_ks", []).append(k)
                print(f"[bench.pipeline] k={k} skipped: {elapsed:.0f} s spent, the last run took "
                      f"{last:.0f} s, budget {args.budget_s:.0f} s", flush=True)
                continue
            run_dir = root / f"k{k}-{int(time.time())}"
            t_k = time.perf_counter()
            cut: BaseException | None = None
            try:
                history, wall = run_k(k, overrides, run_dir, factory)
            except BaseException as e:  # noqa: BLE001 - keep the steps it logged, then stop
                history, wall, cut = logged_history(run_dir / "metrics.jsonl"), time.perf_counter() - t_k, e
                if not history:
                    raise
                extra.setdefault("cut", {})[str(k)] = (f"{type(e).__name__}: {e}"[:300] + f"; {len(history)} "
                                                       "steps kept from its metrics.jsonl")
                print(f"[bench.pipeline] k={k} cut short ({type(e).__name__}): summarising its "
                      f"{len(history)} logged steps", flush=True)
            last = time.perf_counter() - t_k
            histories[str(k)] = history
            spans = run_dir / "timeline.jsonl"
            rows.append(summarise(k, history, wall, Timeline.from_jsonl(spans) if spans.exists() else None))
            for name in ("timeline.png", "timeline.jsonl"):
                if (run_dir / name).exists():
                    shutil.copy(run_dir / name, root / name.replace("timeline", f"timeline_k{k}"))
            progress("pipeline", rows[-1])
            if k == 0:  # at once: a run cut short still shows whether the workload is balanced
                _balance_line(compare(rows))
            _write(args.out, {"bench": "pipeline", "machine": machine(), "partial": True,
                              "rows": rows, **extra, **compare(rows), "history": histories})
            if cut is not None:
                raise cut
    extra.update(compare(rows))
    _balance_line(extra)
    report("pipeline", args, rows, {**extra, "history": histories}, columns=COLUMNS)


if __name__ == "__main__":
    main()
