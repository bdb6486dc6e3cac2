"""Whether the order of a step's timed windows, or the candidate's kill, moves the credited speedup:
each task's own ``Model`` as the answer (a true speedup of 1), with ``timing_probe`` on, so every
step also times the reference while the candidate still lives, the candidate a second time, and
the reference again at once and after a settle (sandbox/run_timing.py ``Timing._probe``).

Per task, medians over its evaluations of: the credited speedup (reference timed after the kill /
candidate), and each extra window against the one it is paired with. The reference is timed in
every step (``reference_per_step``). One evaluation at a time.

    python -m bench.timing_order --backend cuda --tasks L1/17_relu,L1/19_silu,L1/12_softmax --evals 6
    python -m bench.timing_order --backend cpu --evals 6
"""
from __future__ import annotations

import asyncio
import os
import statistics
from typing import Any

from bench.common import parser, progress, report

RATIOS = {  # name -> (numerator, denominator), from the step's times
    "credited": ("ref_after_kill", "cand"),
    "ref_alive/cand": ("ref_alive", "cand"),
    "cand_again/cand": ("cand_again", "cand"),
    "ref_after_kill/ref_alive": ("ref_after_kill", "ref_alive"),
    "ref_again/ref_after_kill": ("ref_again", "ref_after_kill"),
    "ref_settled/ref_after_kill": ("ref_settled", "ref_after_kill"),
    "second windows (ref_again/cand_again)": ("ref_again", "cand_again"),
}


async def evaluations(task_ids: list[str], n: int, backend: str) -> list[dict[str, Any]]:
    from rewards.tasks.loader import load_builtin
    from sandbox.config import load_default_config
    from sandbox.pool import SandboxPool

    tasks = {t.id: t for t in load_builtin(profile="cpu" if backend == "cpu" else "full")}
    unknown = sorted(set(task_ids) - set(tasks))
    if unknown:
        raise SystemExit(f"--tasks: unknown {unknown}; built-in tasks are named like L1/17_relu")
    cfg = load_default_config(max_concurrent=1, compile_workers=1, reference_per_step=True, timing_probe=True)
    rows = []
    async with SandboxPool(cfg) as pool:
        for k in range(n):
            for tid in task_ids:
                src = tasks[tid].source
                res = await pool.evaluate(src, f"{src}\n# {k}\nModelNew = Model\n", backend)
                w = res.wall_s
                row = {"task": tid, "eval": k, "correct": res.correct, "cand": res.new_runtime_ms,
                       "ref_after_kill": res.ref_runtime_ms, "ref_alive": w.get("probe_ref_alive_ms"),
                       "cand_again": w.get("probe_cand_again_ms"), "ref_again": w.get("probe_ref_again_ms"),
                       "ref_settled": w.get("probe_ref_settled_ms")}
                rows.append(row)
                progress("timing_order", row)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for tid in dict.fromkeys(r["task"] for r in rows):
        ok = [r for r in rows if r["task"] == tid and r["correct"] and all(r.get(k) for k in
                                                                          ("cand", "ref_after_kill", "ref_alive"))]
        line: dict[str, Any] = {"task": tid, "evals": len(ok)}
        for name, (a, b) in RATIOS.items():
            vals = [r[a] / r[b] for r in ok if r.get(a) and r.get(b)]
            line[name] = round(statistics.median(vals), 3) if vals else None
        out.append(line)
    return out


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--tasks", default="L1/17_relu,L1/19_silu,L1/22_leaky_relu,L1/18_gelu")
    p.add_argument("--evals", type=int, default=6, help="evaluations per task")
    args = p.parse_args()
    rows = asyncio.run(evaluations(args.tasks.split(","), args.evals, args.backend))
    report("timing_order", args, summary(rows), {"load_avg": os.getloadavg(), "evaluations": rows})


if __name__ == "__main__":
    main()
