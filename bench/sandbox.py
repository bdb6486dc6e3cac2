"""Sandbox throughput: evaluations/min and compile time p50/p95 through ``sandbox.SandboxPool``,
cold (every candidate a distinct build) and cached (the same candidates again: build-cache hits).

Candidates are the project's known-correct answers (rewards/solutions/<backend>) for several
tasks, each copy made distinct by a comment line, so that every cold evaluation is a real
``load_inline`` build (the build key is the candidate's content hash), as RL samples are.

    python -m bench.sandbox --backend cpu --distinct 6 --out runs/bench/sandbox_cpu.json
    python -m bench.sandbox --backend cuda --distinct 32 --max-concurrent 16 --compile-workers 12
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.common import parser, percentile, progress, report, target

# the targets of the cuda backend on 16 cores + 1 GPU
TARGETS = {"cold_compile_p50_s": 8.0, "cache_hit_s": 0.5, "evals_per_min": 60.0}


def candidates(backend: str, n: int, first: int = 0) -> list[tuple[str, str, str]]:
    """(task id, reference source, candidate source) x n, each candidate a distinct build."""
    from rewards.solutions import available, load_solution
    from rewards.tasks.loader import load_builtin

    profile = "cpu" if backend == "cpu" else "full"
    tasks = {t.id: t for t in load_builtin(profile=profile)}
    ids = [i for i in available(backend) if i in tasks]
    if not ids:
        raise SystemExit(f"no {backend} solutions match a built-in task")
    out = []
    for k in range(first, first + n):
        tid = ids[k % len(ids)]
        out.append((tid, tasks[tid].source, f"# bench variant {k}\n" + load_solution(backend, tid)))
    return out


async def run_phase(pool: Any, work: list[tuple[str, str, str]], backend: str) -> tuple[float, list[Any]]:
    t0 = time.monotonic()
    done = 0

    async def one(i: int, ref: str, cand: str) -> Any:
        nonlocal done
        r = await pool.evaluate(ref, cand, backend, key=f"b{i}")
        done += 1
        print(f"[bench.sandbox] {done}/{len(work)} at {time.monotonic() - t0:.1f}s: {work[i][0]} "
              f"correct={r.correct} cache_hit={r.cache_hit} wall_s={r.wall_s} {r.error_kind or ''}", flush=True)
        return r

    results = await asyncio.gather(*[one(i, ref, cand) for i, (_, ref, cand) in enumerate(work)])
    return time.monotonic() - t0, list(results)


def summarise(phase: str, wall: float, results: list[Any]) -> dict[str, Any]:
    compiles = [r.wall_s["compile"] for r in results if not r.cache_hit and "compile" in r.wall_s]
    loads = [r.wall_s.get("load", float("nan")) for r in results if r.cache_hit]
    totals = [r.wall_s.get("total", float("nan")) for r in results]
    return {"phase": phase, "evals": len(results), "correct": sum(r.correct for r in results),
            "cache_hits": sum(r.cache_hit for r in results), "wall_s": wall,
            "evals_per_min": len(results) / wall * 60 if wall > 0 else float("nan"),
            "compile_p50_s": percentile(compiles, 50), "compile_p95_s": percentile(compiles, 95),
            "hit_load_p50_s": percentile(loads, 50), "hit_load_p95_s": percentile(loads, 95),
            "eval_p50_s": percentile(totals, 50), "eval_p95_s": percentile(totals, 95)}


async def amain(args: Any) -> None:
    from sandbox.config import load_default_config
    from sandbox.pool import SandboxPool

    overrides: dict[str, Any] = {"backend": args.backend}
    for key in ("max_concurrent", "compile_workers", "cache_dir", "max_jobs"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.split_build_cuda:  # the split CUDA build (sandbox/split_cuda.py), off by default
        overrides.update(split_build=True, split_build_cuda=True)
    cfg = load_default_config(**overrides)
    work = candidates(args.backend, args.distinct)
    failures: list[dict[str, Any]] = []
    async with SandboxPool(cfg) as pool:
        rows = []
        if args.prime:
            # other distinct builds first: the pool learns the candidates' flag sets and builds
            # their precompiled headers, as it does in the first minute of a training run
            wall, results = await run_phase(pool, candidates(args.backend, args.prime, first=100_000), args.backend)
            rows.append(summarise("prime (no PCH yet)", wall, results))
            progress("sandbox", rows[-1])
            t = time.monotonic()
            await pool.headers_ready()
            print(f"[bench.sandbox] precompiled headers ready after {time.monotonic() - t:.1f}s more", flush=True)
        for phase in ["cold"] + ["cached"] * args.cached_rounds:
            wall, results = await run_phase(pool, work, args.backend)
            rows.append(summarise(phase, wall, results))
            progress("sandbox", rows[-1])
            failures += [{"phase": phase, "task": work[i][0], "error_kind": r.error_kind,
                          "error": (r.error or "")[:300]} for i, r in enumerate(results) if not r.correct]
        stats = pool.stats()
    cold, cached = rows[1 if args.prime else 0], rows[-1]
    extra: dict[str, Any] = {"backend": args.backend, "max_concurrent": cfg.max_concurrent,
                             "compile_workers": cfg.compile_workers, "pool_stats": stats,
                             "failures": failures[:20]}
    if args.backend == "cuda":
        extra["target_cold_compile_p50_le_8s"] = target(cold["compile_p50_s"] <= TARGETS["cold_compile_p50_s"])
        extra["target_cache_hit_le_0.5s"] = target(cached["hit_load_p50_s"] <= TARGETS["cache_hit_s"])
        extra["target_ge_60_distinct_evals_per_min"] = target(cold["evals_per_min"] >= TARGETS["evals_per_min"])
    report("sandbox", args, rows, extra)


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "triton"])
    p.add_argument("--distinct", type=int, default=6, help="distinct candidates (cold builds)")
    p.add_argument("--cached-rounds", type=int, default=1)
    p.add_argument("--prime", type=int, default=0,
                   help="distinct builds before the cold phase, then wait for the PCHs they asked for")
    p.add_argument("--max-concurrent", dest="max_concurrent", type=int, default=None)
    p.add_argument("--compile-workers", dest="compile_workers", type=int, default=None)
    p.add_argument("--max-jobs", dest="max_jobs", type=int, default=None)
    p.add_argument("--cache-dir", dest="cache_dir", default=None)
    p.add_argument("--split-build-cuda", action="store_true", help="sandbox.split_build_cuda on (the split CUDA build)")
    asyncio.run(amain(p.parse_args()))


if __name__ == "__main__":
    main()
