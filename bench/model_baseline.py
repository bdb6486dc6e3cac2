"""A pretrained checkpoint's baseline on KernelBench, with the project's own prompt, parser, rules,
sandbox and multi-turn feedback: no training, one process, no Ray.

    # GPU (vLLM through pipeline.engines, CUDA kernels), 4 turns with feedback as Kevin-32B evaluates
    python -m bench.model_baseline --model /tmp/models/qwen2.5-coder-1.5b-instruct --engine vllm \
        --backend cuda --tasks .kb/KernelBench --levels 1 2 --split holdout --k 8 --turns 4 \
        --temperature 1.0 --max-new-tokens 2048 --out bench/baselines/h100/q15_holdout_t4.json \
        --samples bench/baselines/h100/q15_holdout_t4.jsonl
    # CPU (transformers, C++ kernels on built-in tasks at CPU sizes)
    python -m bench.model_baseline --model qwen2.5-coder-0.5b-instruct --engine hf --backend cpu \
        --tasks builtin --levels 1 --problem-ids 19 21 --k 8 --turns 1 --max-new-tokens 1024

The episodes are pipeline.rollout.run_episodes (the sampler's own code), the environment is
rewards.interface.kernel_env, and the held-out metrics are pipeline.evaluate.evaluation_metrics
(pass@k, best@k, fast_p per turn budget); on top of those this reports per-sample rates (parsed,
compiled, correct, faster than the reference), the mean speedup of correct answers, error kinds
and the correct rate of each turn. ``--model`` is a checkpoint directory or a preset name (the
fetch cache's ``models/NAME``). ``--budget-s`` stops generation and evaluation in time for a
device call's limit; the JSON then says ``budget_hit`` and counts what finished.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import machine
from rewards.interface import TurnOutcome

# what a Sample without an outcome counts as: nothing parsed, compiled or correct
_NO_OUTCOME = TurnOutcome(score=0.0, feedback="")


def _outcome(s: Any) -> TurnOutcome:
    return s.outcome if s.outcome is not None else _NO_OUTCOME


def log(msg: str) -> None:
    print(f"[model_baseline] {msg}", file=sys.stderr, flush=True)


def resolve_model(arg: str) -> str:
    """A preset name (qwen2.5-coder-1.5b-instruct ...) is the fetch cache's directory of it."""
    from pipeline.models.fetch import MODELS, fetch_hint, model_dir

    if arg in MODELS and not Path(arg).exists():
        d = model_dir(arg)
        if not (d / "config.json").is_file():
            raise SystemExit(f"--model {arg}: {d} has no checkpoint; fetch it: {fetch_hint(arg)}")
        return str(d)
    return os.path.expanduser(arg)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.model_baseline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory or a preset name")
    ap.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    ap.add_argument("--backend", choices=("cuda", "triton", "cpu"), default="cuda")
    ap.add_argument("--tasks", default="builtin", help="'builtin' or a KernelBench checkout (levelN/ inside)")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--split", choices=("holdout", "train", "all"), default="all",
                    help="the env's split (reward.holdout_frac/split_seed); all: both")
    ap.add_argument("--problem-ids", type=int, nargs="*", default=[],
                    help="keep only these problem numbers (the file name's leading number)")
    ap.add_argument("--max-tasks", type=int, default=0, help="keep the first N tasks of the selection (0: all)")
    ap.add_argument("--k", type=int, default=8, help="trajectories per task")
    ap.add_argument("--turns", type=int, default=1, help="turns per trajectory (feedback between them)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=2048)
    ap.add_argument("--max-prompt-tokens", type=int, default=8192)
    ap.add_argument("--no-example", action="store_true", help="reward.worked_example=false")
    ap.add_argument("--profile", choices=("full", "cpu"), default=None,
                    help="task sizes (default: full for cuda/triton, cpu for cpu)")
    ap.add_argument("--dtype", default=None, help="model dtype (default bfloat16; float32 for hf on cpu)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4,
                    help="vLLM's share of the GPU; evaluations get what it leaves")
    ap.add_argument("--max-concurrent", type=int, default=None, help="sandbox.max_concurrent")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="vLLM captures CUDA graphs (default eager: a shorter start for a short run)")
    ap.add_argument("--hf-batch", type=int, default=16, help="hf engine: max_batch_size")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="stop generating and evaluating after this long (0: no limit)")
    ap.add_argument("--sandbox", nargs="*", default=[], help="more sandbox overrides, key=value")
    ap.add_argument("--reward", nargs="*", default=[], help="more reward overrides, key=value")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="JSON of the run (config, metrics, cost)")
    ap.add_argument("--samples", type=Path, default=None, help="JSONL: one line per turn as scored")
    a = ap.parse_args(argv)
    if a.k < 1 or a.turns < 1 or a.max_new_tokens < 1:
        ap.error("--k, --turns and --max-new-tokens must be >= 1")
    return a


def configs(a: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(reward, sandbox, rollout) configs from conf/ with this run's overrides."""
    from pipeline.conf_files import load_group
    from pipeline.rollout_config import load_rollout_config
    from rewards.config import load_reward_config
    from sandbox.config import SandboxConfig

    gpu = a.backend in ("cuda", "triton")
    profile = a.profile or ("full" if gpu else "cpu")
    reward = load_reward_config(
        "kernel_cuda" if gpu else "kernel",
        dotlist=[f"backend={a.backend}", f"profile={profile}", f"levels={list(a.levels)}",
                 f"worked_example={'false' if a.no_example else 'true'}", *a.reward],
        tasks=str(Path(a.tasks).resolve()) if a.tasks != "builtin" else "builtin")
    sb = [f"backend={a.backend}"]
    if a.max_concurrent:
        sb.append(f"max_concurrent={a.max_concurrent}")
    if gpu and a.engine == "vllm":
        # evaluations share the engine's GPU: reserve what vLLM leaves, and time the reference under
        # the same load (as pipeline.evaluator_memory.leave_room_for_pools does for a training run)
        sb += [f"gpu_memory_share={round(max(0.05, 0.95 - a.gpu_memory_utilization - 0.05), 3)}",
               "reference_per_step=true"]
    sandbox = load_group(SandboxConfig, "sandbox", "default", sb + list(a.sandbox))
    rollout = load_rollout_config(a.engine, [
        f"n_trajectories={a.k}", f"turns={a.turns}", f"temperature={a.temperature}", f"top_p={a.top_p}",
        f"max_response_length={a.max_new_tokens}", "response_length_schedule=[]",
        f"max_prompt_length={a.max_prompt_tokens}"])
    if a.engine == "vllm":
        v = rollout.engine.vllm
        v.gpu_memory_utilization = a.gpu_memory_utilization
        v.max_model_len = a.max_prompt_tokens + a.max_new_tokens + 256
        v.enable_sleep_mode = False
        v.seed = a.seed
        v.tensor_parallel_size = 1
        v.enforce_eager = not a.cuda_graphs
    else:
        rollout.engine.hf.max_batch_size = a.hf_batch
    return reward, sandbox, rollout


def select(env: Any, a: argparse.Namespace) -> list[Any]:
    splits = ("train", "holdout") if a.split == "all" else (a.split,)
    tasks = [t for s in splits for t in env.tasks(s)]
    if a.problem_ids:
        want = set(a.problem_ids)
        tasks = [t for t in tasks if t.payload.problem_id in want]
    # interleaved across levels (L1/a, L2/b, L1/c, ...): the first N cover every level alike
    by_level: dict[int, list[Any]] = {}
    for t in sorted(tasks, key=lambda t: (t.payload.level, t.payload.problem_id)):
        by_level.setdefault(t.payload.level, []).append(t)
    tasks = [t for rank in range(max((len(v) for v in by_level.values()), default=0))
             for _, v in sorted(by_level.items()) if rank < len(v) for t in [v[rank]]]
    if a.max_tasks:
        tasks = tasks[:a.max_tasks]
    return tasks


def row_rates(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-sample rates over sample rows as :func:`sample_row` writes them (a row without an outcome
    counts as nothing parsed, compiled or correct); bench.kevin_mini reads the same rows back."""
    n = len(rows)
    if not n:
        return {"n": 0}
    speeds = [float(r["speedup"]) for r in rows if r.get("correct") and r.get("speedup") is not None]
    return {"n": n,
            "parsed": sum(bool(r.get("parse_ok")) for r in rows) / n,
            "compiled": sum(bool(r.get("compiled")) for r in rows) / n,
            "correct": sum(bool(r.get("correct")) for r in rows) / n,
            "fast_1": sum(1 for s in speeds if s > 1.0) / n,
            "mean_speedup_correct": sum(speeds) / len(speeds) if speeds else None,
            "max_speedup_correct": max(speeds) if speeds else None,
            "truncated": sum(r.get("finish") == "length" for r in rows) / n,
            "mean_response_tokens": sum(r.get("response_tokens", 0) for r in rows) / n}


def sample_rates(samples: list[Any], turns: int) -> dict[str, Any]:
    """Per-sample rates over every scored turn, per turn, the error kinds and speedups."""
    rows = [sample_row(s) for s in samples]
    out: dict[str, Any] = {"all": row_rates(rows)}
    out["per_turn"] = {str(t + 1): row_rates([r for r in rows if r["turn"] == t]) for t in range(turns)}
    kinds = Counter(str(o.error_kind or ("correct" if o.correct else "none"))
                    for o in map(_outcome, samples))
    out["error_kinds"] = dict(kinds.most_common())
    hacks = Counter(h for s in samples for h in _outcome(s).hacks)
    out["rules_broken"] = dict(hacks.most_common())
    by_task: dict[str, dict[str, Any]] = {}
    for s in samples:
        o = _outcome(s)
        r = by_task.setdefault(s.task_id, {"samples": 0, "compiled": 0, "correct": 0, "best_speedup": None})
        r["samples"] += 1
        r["compiled"] += o.compiled
        r["correct"] += o.correct
        if o.correct and o.speedup is not None:
            r["best_speedup"] = max(float(o.speedup), r["best_speedup"] or 0.0)
    out["per_task"] = by_task
    return out


def sample_row(s: Any) -> dict[str, Any]:
    # the outcome's fields by name, None where the Sample has no outcome (as the JSONL always wrote)
    o = dataclasses.asdict(s.outcome) if s.outcome is not None else {}
    return {"task": s.task_id, "traj": s.traj, "turn": s.turn, "score": s.score, "finish": s.finish_reason,
            "prompt_tokens": len(s.prompt_ids), "response_tokens": len(s.response_ids),
            "parse_ok": o.get("parse_ok"), "compiled": o.get("compiled"), "correct": o.get("correct"),
            "speedup": o.get("speedup"), "error_kind": o.get("error_kind"), "hacks": o.get("hacks"),
            "feedback": (o.get("feedback") or "")[:1500], "error": s.error,
            "gen_s": round(s.t_gen_end - s.t_gen_start, 2), "eval_s": round(s.t_eval_end - s.t_gen_end, 2),
            "response": s.response_text}


async def episodes(engine: Any, tokenizer: Any, env: Any, tasks: list[Any], rollout: Any,
                   budget_s: float, on_sample: Any) -> tuple[list[Any], bool, Any]:
    from pipeline.rollout import BatchStats, run_episodes

    got: list[Any] = []
    stats = BatchStats()

    async def keep(s: Any) -> None:
        got.append(s)
        on_sample(s)

    run = run_episodes(engine, tokenizer, env, tasks, 0, 0, rollout, on_sample=keep, stats=stats)
    try:
        if budget_s > 0:
            await asyncio.wait_for(run, budget_s)
        else:
            await run
        return got, False, stats
    except asyncio.TimeoutError:
        return list(got), True, stats


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t_start = time.time()
    model_path = resolve_model(a.model)
    from pipeline.models.load import check_checkpoint_dir

    check_checkpoint_dir(model_path)
    reward, sandbox, rollout = configs(a)

    from rewards.interface import kernel_env

    env = kernel_env(reward, sandbox)
    tasks = select(env, a)
    if not tasks:
        raise SystemExit(f"no tasks: --tasks {a.tasks} --levels {a.levels} --split {a.split} "
                         f"--problem-ids {a.problem_ids}")
    log(f"{len(tasks)} tasks x k={a.k} x {a.turns} turn(s) = {len(tasks) * a.k * a.turns} turns at most; "
        f"model {model_path}, {a.engine}, backend {a.backend}, example {'off' if a.no_example else 'on'}")

    from pipeline.engines import make_engine
    from pipeline.models.config import ModelConfig  # noqa: F401  (schema of model_cfg below)
    from pipeline.models.load import load_model_config, load_tokenizer

    dtype = a.dtype or ("float32" if a.engine == "hf" and a.backend == "cpu" else "bfloat16")
    model_cfg = load_model_config("local", [f"path={model_path}", f"dtype={dtype}"])
    t0 = time.time()
    if a.engine == "hf":
        from pipeline.models.load import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(model_cfg)
        if a.backend != "cpu":
            rollout.engine.hf.device = "cuda"
        engine = make_engine(rollout.engine, model, tokenizer)
    else:
        tokenizer = load_tokenizer(model_cfg)
        engine = make_engine(rollout.engine, model_path, tokenizer)
    load_s = time.time() - t0
    log(f"engine up in {load_s:.1f} s")

    sink = None
    if a.samples:
        a.samples.parent.mkdir(parents=True, exist_ok=True)
        sink = open(a.samples, "w")
    n_done = [0]

    def on_sample(s: Any) -> None:
        n_done[0] += 1
        o = _outcome(s)
        if n_done[0] % 8 == 0 or o.correct:
            log(f"{n_done[0]} scored; last {s.task_id} t{s.turn + 1} "
                f"{'correct %.2fx' % float(o.speedup or 0) if o.correct else o.error_kind}")
        if sink is not None:
            sink.write(json.dumps(sample_row(s)) + "\n")
            sink.flush()

    async def go() -> tuple[list[Any], bool, Any]:
        try:
            return await episodes(engine, tokenizer, env, tasks, rollout, a.budget_s, on_sample)
        finally:
            for closer in (getattr(engine, "aclose", None), env.aclose):
                if closer is not None:
                    try:
                        await closer()
                    except Exception as e:  # noqa: BLE001  (the results still get written)
                        log(f"close: {type(e).__name__}: {e}")

    t1 = time.time()
    samples, budget_hit, stats = asyncio.run(go())
    run_s = time.time() - t1
    if sink is not None:
        sink.close()

    from pipeline.evaluate import evaluation_metrics

    ks = [k for k in (1, 4, 8, 16) if k <= a.k]
    metrics = evaluation_metrics(samples, a.turns, ks, [0.0, 1.0, 1.5]) if samples else {}
    rates = sample_rates(samples, a.turns)
    rec = {
        "model": model_path, "model_name": Path(model_path).name, "engine": a.engine, "backend": a.backend,
        "tasks_root": a.tasks, "levels": a.levels, "split": a.split, "problem_ids": a.problem_ids,
        "task_ids": [t.task_id for t in tasks], "k": a.k, "turns": a.turns, "temperature": a.temperature,
        "top_p": a.top_p, "max_new_tokens": a.max_new_tokens, "worked_example": not a.no_example,
        "dtype": dtype, "budget_s": a.budget_s, "budget_hit": budget_hit,
        "expected_samples": len(tasks) * a.k * a.turns, "samples": len(samples),
        "metrics": metrics, **rates,
        "cost": {"engine_load_s": round(load_s, 1), "episodes_s": round(run_s, 1),
                 "total_s": round(time.time() - t_start, 1),
                 "response_tokens": sum(len(s.response_ids) for s in samples),
                 "failures": stats.failures[:5]},
        "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "argv": sys.argv[1:] if argv is None else argv,
    }
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rec, indent=1))
    print(summary(rec))
    return 0


def fmt(x: Any, pct: bool = True) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if pct else f"{x:.2f}"


def summary(rec: dict[str, Any]) -> str:
    r, m = rec["all"], rec["metrics"]
    lines = [f"## {rec['model_name']} {rec['engine']}/{rec['backend']} k={rec['k']} turns={rec['turns']} "
             f"example={'on' if rec['worked_example'] else 'off'} ({len(rec['task_ids'])} tasks, "
             f"{rec['samples']}/{rec['expected_samples']} turns scored{', BUDGET HIT' if rec['budget_hit'] else ''})",
             "| correct | compiled | parsed | fast_1 (samples) | fast_1 (tasks) | best@k correct | "
             "pass@1 | mean speedup of correct |",
             "|---|---|---|---|---|---|---|---|",
             f"| {fmt(r.get('correct'))} | {fmt(r.get('compiled'))} | {fmt(r.get('parsed'))} | "
             f"{fmt(r.get('fast_1'))} | {fmt(m.get('eval/fast_1'))} | {fmt(m.get('eval/best_correct'))} | "
             f"{fmt(m.get('eval/pass@1'))} | {fmt(r.get('mean_speedup_correct'), False)} |",
             "per turn correct: " + ", ".join(f"t{t}: {fmt(v.get('correct'))} of {v.get('n')}"
                                              for t, v in rec["per_turn"].items()),
             "error kinds: " + ", ".join(f"{k} {v}" for k, v in rec["error_kinds"].items()),
             f"cost: {rec['cost']['engine_load_s']} s engine, {rec['cost']['episodes_s']} s episodes, "
             f"{rec['cost']['response_tokens']} response tokens; {rec['machine']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
