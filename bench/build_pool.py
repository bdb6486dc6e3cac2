"""Distinct cold builds per minute against the number of build nodes (``sandbox.build_pool=ray``).

For each count in ``--nodes`` a local Ray cluster is started with Ray's own test tool
(``ray.cluster_utils.Cluster``): a head node without CPUs (the driver's) and that many nodes of
``--cpus-per-node`` CPUs, each offering the resource builds ask for. A fresh pool (fresh cache,
fresh node dirs: every build cold) evaluates ``--answers`` distinct answers at once; each is a
C++ answer made distinct by a comment, as RL samples are, so nothing can serve it from a cache.
The ``local`` row is the same pool with ``build_pool=local`` and ``compile_workers`` =
``--cpus-per-node`` (one node's worth, on the driver's host). PCH and split build are off in every
row (remote builds run without them).

Each row's time runs from the first evaluation to the last verdict (the build actors' start, a
one-off of a few seconds, is measured before it and reported apart; the box's load average after
each row says how much else ran beside it): builds plus the run steps on
the driver (a few seconds each, overlapping later builds). On one box the nodes share its cores,
so the figure shows the hand-over's cost and that builds spread over the nodes, not the speedup of
real machines: past the box's core count more nodes cannot build faster.

    python -m bench.build_pool --nodes 1,2,3 --answers 3 --out bench/baselines/cpu/build_pool.json
"""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import parser, progress, report

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "tests" / "fixtures" / "sandbox" / "tasks" / "add.py"
ANSWERS = {"torch": ROOT / "tests" / "fixtures" / "sandbox" / "answers" / "add_cpp_correct.py",   # torch/extension.h
           "tiny": ROOT / "tests" / "fixtures" / "sandbox" / "answers" / "add_cpp_python_api.py"}  # Python.h only
RESOURCE = "bench_builder"


def answers(kind: str, n: int, tag: str) -> list[str]:
    src = ANSWERS[kind].read_text()
    return [src.replace('_SRC = r"""', f'_SRC = r"""\n// bench.build_pool {tag} answer {i}', 1) for i in range(n)]


async def evaluate_all(cfg: Any, srcs: list[str]) -> dict[str, Any]:
    from sandbox.pool import SandboxPool

    task = TASK.read_text()
    async with SandboxPool(cfg) as pool:
        t = time.monotonic()
        await pool.headers_ready()  # the build actors started and probed: a one-off cost, reported apart
        start_s = time.monotonic() - t
        t0 = time.monotonic()
        results = await asyncio.gather(*(pool.evaluate(task, s, "cpu") for s in srcs))
        seconds = time.monotonic() - t0
        stats = pool.stats()
    nodes = {k.split("/", 1)[1] for k in stats if k.startswith("built_on/")}
    compile_s = [r.wall_s.get("compile", 0.0) for r in results]
    return {"answers": len(srcs), "correct": sum(r.correct for r in results), "seconds": round(seconds, 1),
            "builds_per_min": round(len(srcs) / seconds * 60, 2), "compile_s_max": max(compile_s),
            "build_nodes_used": len(nodes), "built_here": int(stats.get("remote_builds_made_here", 0)),
            "actors_start_s": round(start_s, 1), "load_1m_after": round(os.getloadavg()[0], 1)}


def row(n_nodes: int, args: Any, base: Any) -> dict[str, Any]:
    import dataclasses

    work = Path(tempfile.mkdtemp(prefix="bench_build_pool_"))
    tag = f"{n_nodes}-{work.name}"
    try:
        if n_nodes == 0:
            cfg = dataclasses.replace(base, cache_dir=str(work / "cache"), compile_workers=args.cpus_per_node)
            return {"nodes": "local", **asyncio.run(evaluate_all(cfg, answers(args.answer, args.answers, tag)))}
        import ray
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        try:
            for _ in range(n_nodes):
                cluster.add_node(num_cpus=args.cpus_per_node, resources={RESOURCE: args.cpus_per_node})
            ray.init(address=cluster.address, log_to_driver=False)
            cfg = dataclasses.replace(base, cache_dir=str(work / "cache"), build_pool="ray",
                                      ray_build_workers=n_nodes * args.cpus_per_node, ray_build_resource=RESOURCE,
                                      ray_build_node_dir=str(work / "node-{node}"))
            return {"nodes": n_nodes, **asyncio.run(evaluate_all(cfg, answers(args.answer, args.answers, tag)))}
        finally:
            ray.shutdown()
            cluster.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--nodes", default="1,2,3", help="build node counts, comma-separated (0: the local row)")
    p.add_argument("--answers", type=int, default=3, help="distinct answers per row (all cold)")
    p.add_argument("--cpus-per-node", dest="cpus_per_node", type=int, default=1)
    p.add_argument("--answer", choices=sorted(ANSWERS), default="torch",
                   help="torch: a real C++ answer (torch/extension.h, ~30 s a build); tiny: Python.h only (~2 s)")
    p.add_argument("--no-local", dest="local", action="store_false", help="skip the local row")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from sandbox.config import load_default_config

    base = load_default_config(precompiled_header=False, split_build=False, warmup_runs=1, timing_runs=5,
                               correctness_trials=3, max_concurrent=args.answers)
    counts = ([0] if args.local else []) + [int(n) for n in args.nodes.split(",") if n.strip()]
    rows = []
    for n in counts:
        rows.append(row(n, args, base))
        progress("build_pool", rows[-1])
    report("build_pool", args, rows, extra={"box_cores": os.cpu_count(),
                                            "note": "nodes share this box's cores: see docs/sandbox.md"})


if __name__ == "__main__":
    main()
