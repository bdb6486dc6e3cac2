"""What a cache-hit evaluation costs outside the answer's own run: process start, imports, and the
pool's whole evaluation, against the time its parts report; a fresh worker per step (``python -m
sandbox.worker``) against one forked by the pool's zygote (``zygote_worker``; on the cuda backend
``zygote_gpu_steps``, sandbox/zygote.py), side by side.

The candidate is the task's own reference (``ModelNew = Model``): nothing to build, so every
evaluation is what a build-cache hit costs, and the answer's own run is the task's reference.
The two pools run at once and take turns, one evaluation each, so both see the same load. The
import figures are fresh interpreters, as a fresh worker is.

    python -m bench.eval_overhead --evals 8 --out bench/baselines/cpu/eval_overhead_zygote.json
    python -m bench.eval_overhead --backend cuda --evals 8 --out bench/baselines/h100/eval_overhead_zygote.json

On cuda each evaluation also runs on the GPU (the task at its full size), one at a time.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import parser, percentile, progress, report

IMPORTS = {
    "python_start": "pass",
    "import_torch": "import torch",
    # what a run step's judge imports before it forks the runners
    "import_judge_path": "import torch, sandbox.worker, sandbox.judge, sandbox.run_step, sandbox.runner",
}


def import_times(repeats: int) -> dict[str, dict[str, float]]:
    out = {}
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    for name, code in IMPORTS.items():
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, env=env)
            ts.append(time.perf_counter() - t0)
        out[name] = {"p50_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts)}
        progress("eval_overhead", {"what": name, **out[name]})
    return out


VARIANTS = {"fresh": False, "zygote": True}   # row prefix -> SandboxConfig.zygote_worker (and zygote_gpu_steps)


async def evaluations(task_id: str, n: int, variants: list[str], backend: str = "cpu") -> dict[str, list[dict[str, Any]]]:
    from rewards.tasks.loader import load_builtin
    from sandbox.config import load_default_config
    from sandbox.pool import SandboxPool

    task = {t.id: t for t in load_builtin(profile="cpu" if backend == "cpu" else "full")}[task_id]
    pools = {v: SandboxPool(load_default_config(max_concurrent=1, compile_workers=1, zygote_worker=VARIANTS[v],
                                                zygote_gpu_steps=VARIANTS[v]))
             for v in variants}
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        for k in range(n):
            for v, pool in pools.items():
                t0 = time.perf_counter()
                res = await pool.evaluate(task.source, f"{task.source}\n# {k}\nModelNew = Model\n", backend)
                rows[v].append({"eval": k, "correct": res.correct, "outer_s": time.perf_counter() - t0,
                                "ref_ms": res.ref_runtime_ms, "new_ms": res.new_runtime_ms, **res.wall_s})
                progress("eval_overhead", {"variant": v, **rows[v][-1]})
    finally:
        for pool in pools.values():
            await pool.aclose()
    return rows


def summary(prefix: str, evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    later = evals[1:] or evals  # the first also times the reference (cached after) and starts the zygote
    keys = sorted({k for r in later for k, v in r.items() if isinstance(v, float) and k.endswith("_s")
                   or k in ("total", "worker_total", "judge_imports")})
    return [{"what": f"{prefix}/{k}", "p50 s": percentile([r[k] for r in later if k in r], 50),
             "min s": min(r[k] for r in later if k in r), "max s": max(r[k] for r in later if k in r)}
            for k in keys if any(k in r for r in later)]


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--evals", type=int, default=5)
    p.add_argument("--task", default="L1/17_relu")
    p.add_argument("--repeats", type=int, default=3, help="fresh interpreters per import figure")
    p.add_argument("--variants", default="fresh,zygote", help=f"comma-separated, of {sorted(VARIANTS)}")
    args = p.parse_args()
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected some of {sorted(VARIANTS)}")
    imports = import_times(args.repeats)
    evals = asyncio.run(evaluations(args.task, args.evals, variants, args.backend))
    rows = [row for v in variants for row in summary(v, evals[v])]
    rows += [{"what": k, "p50 s": v["p50_s"], "min s": v["min_s"], "max s": v["max_s"]} for k, v in imports.items()]
    report("eval_overhead", args, rows, {"load_avg": os.getloadavg(), "evals": evals, "imports": imports})


if __name__ == "__main__":
    main()
