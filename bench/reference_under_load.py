"""A stored answer's speedup while another process loads the GPU, with the task's reference time
cached from a quiet GPU and with the reference timed in every step (``sandbox.reference_per_step``).

Why: in the one-GPU vLLM pipeline (H100, 2026-12-06; docs/performance.md, reward correctness) the same stored answers
scored 1.0-1.2x in sync mode and 0.15x in one_off's steps that overlapped training, with the
reference timed once and cached. This measures that bias without Ray or vLLM: the load is a
process issuing bf16 matmuls back to back (a trainer's shape of work), the answers are the
project's stored ones (rewards/solutions/cuda).

    python -m bench.reference_under_load --task L1/12_softmax --repeats 3 --out ref_load.json

Prints one line per evaluation and rewrites the JSON after each: quiet, then under load per step
and cached. A ratio near the quiet one under load is what the reward should see.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

_LOAD = """
import sys, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("load running", flush=True)
while True:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


async def _evaluate(cfg, task_src: str, answer: str, label: str, n: int, rows: list[dict], out: Path) -> None:
    from sandbox.pool import SandboxPool

    async with SandboxPool(cfg) as pool:
        for i in range(n):
            r = await pool.evaluate(task_src, answer + f"\n# {label} {i} {time.time()}\n", "cuda")
            row = {"label": label, "correct": r.correct, "speedup": r.speedup, "ref_ms": r.ref_runtime_ms,
                   "new_ms": r.new_runtime_ms, "ref_timed_here": "ref_timing" in r.wall_s,
                   "error": r.error_kind}
            print(json.dumps(row), flush=True)
            rows.append(row)
            out.write_text(json.dumps({"rows": rows}, indent=1))  # a run cut short keeps its rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="L1/12_softmax")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache-dir", default="/tmp/reference_under_load")
    p.add_argument("--out", default="reference_under_load.json")
    args = p.parse_args()
    from rewards.solutions import load_solution
    from rewards.tasks import load_builtin
    from sandbox.config import load_default_config

    task = next((t for t in load_builtin() if t.id == args.task), None)
    if task is None:
        sys.exit(f"--task {args.task}: not a built-in task (rewards/tasks/builtin)")
    answer = load_solution("cuda", args.task)
    cfg = load_default_config(cache_dir=args.cache_dir, backend="cuda")
    rows: list[dict] = []
    out = Path(args.out)
    asyncio.run(_evaluate(cfg, task.source, answer, "quiet", 1, rows, out))
    load = subprocess.Popen([sys.executable, "-c", _LOAD], stdout=subprocess.PIPE, text=True)
    try:
        load.stdout.readline()
        time.sleep(2.0)
        # per step first: on the H100 the cached phase alone (3 evaluations under load) reached the
        # call's limit before this one began (2026-12-06)
        per_step = dataclasses.replace(cfg, reference_per_step=True)
        asyncio.run(_evaluate(per_step, task.source, answer, "load_per_step", args.repeats, rows, out))
        asyncio.run(_evaluate(cfg, task.source, answer, "load_cached", args.repeats, rows, out))
    finally:
        load.kill()


if __name__ == "__main__":
    main()
