"""The red team's answers (tests/sandbox/redteam.py) through ``sandbox.EvalPool`` on one backend:
each answer, then the task's correct answer in the same pool; a JSON file and a Markdown table
(answer, what it tries, expected, got, reason, as expected?).

    python -m bench.redteam --backend cpu --out /tmp/redteam_cpu.json
    python -m bench.redteam --backend cuda --only A --out runs/bench/redteam_h200_A.json   # on a GPU box,
    python -m bench.redteam --backend cuda --only B,C --out runs/bench/redteam_h200_BC.json  # a group a call
    python -m bench.redteam --backend cpu --only A03,B10 --out /tmp/some.json
    python -m bench.redteam --backend cpu --only A01 --adaptive 12 --out /tmp/adaptive.json  # the statistical cheat

On the 2-core CPU box the whole run takes ~3 min (54 answers and 54 correct answers after them, the
timing-bound ones alone and pinned to one core, the rest two at a time).

The answers are backend-agnostic Python; where a GPU's verdict is known to differ (an in-place write
is caught as ``input_modified`` there, a memfd descriptor is a host tensor where a device tensor is
expected) the answer's ``on["cuda"]`` says so. Planted secrets, listeners and the pool's cache live
in a fresh temporary directory (``--base``), removed at the end unless ``--keep``.
"""
from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import machine, parser, table


async def amain(args: Any) -> int:
    from sandbox.pool import EvalPool
    from tests.sandbox import redteam as rt

    base = Path(args.base or tempfile.mkdtemp(prefix="redteam_"))
    site = rt.Site(base)
    site.start()
    saved = {k: os.environ.get(k) for k in site.env}
    os.environ.update(site.env)  # secrets in the driver's environment: none may reach a verdict
    wanted = [n for n in rt.ANSWERS if not args.only or any(n.startswith(p) for p in args.only.split(","))]
    rows: list[dict[str, Any]] = []
    adaptive: dict[str, Any] | None = None
    host: dict[str, list[str]] = {}
    t0 = time.monotonic()
    overrides: dict[str, Any] = {}
    if args.backend != "cpu":
        overrides["memory_limit_bytes"] = 64 * 2**30
    try:
        async with EvalPool(rt.config(site.cache, run_timeout_s=args.run_timeout, **overrides)) as pool:
            await rt.prime(pool, args.backend)
            for group in "ABC":
                names = [n for n in wanted if rt.ANSWERS[n].group == group]
                try:
                    outcomes = await rt.run_group(pool, site, names, args.backend, parallel=args.parallel)
                except Exception as exc:  # noqa: BLE001 - one broken case must not end the run
                    print(f"[bench.redteam] group {group} failed: {exc!r}; running it one by one", flush=True)
                    outcomes = {}
                    for name in names:
                        try:
                            outcomes[name] = await rt.evaluate(pool, site, name, args.backend)
                        except Exception as one_exc:  # noqa: BLE001
                            outcomes[name] = one_exc
                for name in names:
                    a, o = rt.ANSWERS[name], outcomes[name]
                    if isinstance(o, Exception):
                        problems, got, why, result, follow = [f"bench error: {o!r}"], "bench error", repr(o), {}, {}
                    else:
                        problems = rt.problems(o, site, args.backend)
                        got, why, result, follow = rt.got(o), rt.reason(o), o.result.to_dict(), o.follow.to_dict()
                    expected, flag = a.expectation(args.backend)
                    row = {"answer": name, "group": group, "tries": a.tries,
                           "expected": expected.replace("|", " or ") + (f" [{flag}]" if flag else "")
                           + (f" (speedup <= {a.max_speedup} x honest)" if a.max_speedup else ""),
                           "got": got, "reason": why, "as_expected": not problems,
                           "known_hole": bool(a.hole), "problems": problems, "result": result, "follow": follow,
                           "new_ms": result.get("new_runtime_ms"), "ref_ms": result.get("ref_runtime_ms"),
                           "honest_speedup": follow.get("speedup")}
                    rows.append(row)
                    print(f"[bench.redteam] {name}: {got} (ms {row['new_ms']} ref {row['ref_ms']} honest "
                          f"{row['honest_speedup']}) -- {'ok' if not problems else problems}", flush=True)
                host[group] = site.host_problems()
                rt.cleanup_shm(site)
            adaptive = await _adaptive(pool, rt, site, args) if args.adaptive else None
    finally:
        site.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if not args.keep:
            rt.remove(base)
    wall = time.monotonic() - t0
    summary = {"answers": len(rows), "as_expected": sum(r["as_expected"] for r in rows),
               "known_holes": [r["answer"] for r in rows if r["known_hole"]],
               "unexpected": [r["answer"] for r in rows if not r["as_expected"] and not r["known_hole"]],
               "host_after_group": host, "adaptive_stale_cheat": adaptive, "wall_s": round(wall, 1)}
    md = table([{"answer": r["answer"], "what it tries": _cell(r["tries"], 110), "expected": _cell(r["expected"]),
                 "got": _cell(r["got"]), "reason": _cell(r["reason"], 110)}
                | {"as expected": "yes" if r["as_expected"] else ("no (known hole)" if r["known_hole"] else "NO")}
                for r in rows])
    print(md)
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"machine": machine(), "backend": args.backend, "summary": summary,
                                              "rows": rows, "markdown": md}, indent=2, default=str))
        print(f"[bench.redteam] wrote {args.out}")
    return 0 if not summary["unexpected"] and not any(host.values()) else 1


async def _adaptive(pool: Any, rt: Any, site: Any, args: Any) -> dict[str, Any]:
    """The statistical stale cheat of tests/sandbox/redteam.py (ADAPTIVE) ``args.adaptive`` times, at
    the default timing settings: how often it was caught, credited (correct and > 2x), or neither."""
    counts = {"caught": 0, "credited": 0, "neither": 0}
    runs = []
    for i in range(args.adaptive):
        r = await pool.evaluate(rt.ADAPTIVE_TASK, rt.ADAPTIVE, args.backend, key=f"redteam-adaptive-{i}",
                                timing_runs=20, warmup_runs=3)
        kind = "caught" if r.error_kind else ("credited" if (r.speedup or 0) > 2 else "neither")
        counts[kind] += 1
        runs.append({"kind": kind, "error_kind": r.error_kind, "flags": r.flags, "speedup": r.speedup,
                     "stale_calls": (r.log_tail or "").count("REDTEAM stale")})
        print(f"[bench.redteam] adaptive {i}: {kind} {r.error_kind or ''} {r.flags} speedup {r.speedup}", flush=True)
    return {"counts": counts, "runs": runs}


def _cell(text: Any, limit: int = 0) -> str:
    text = str(text).replace("|", "/").replace("\n", " ")
    return text if not limit or len(text) <= limit else text[:limit - 3] + "..."


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--backend", default="cpu", choices=("cpu", "triton", "cuda"))
    p.add_argument("--only", default="", help="comma-separated name prefixes (A03,B1,...)")
    p.add_argument("--base", default=None, help="directory for the planted secrets and the pool's cache")
    p.add_argument("--keep", action="store_true", help="keep --base afterwards")
    p.add_argument("--run-timeout", type=float, default=20.0, help="run_timeout_s of each evaluation")
    p.add_argument("--parallel", type=int, default=2, help="answers in flight at once (timing-bound ones run alone)")
    p.add_argument("--adaptive", type=int, default=0,
                   help="also run the adaptive stale cheat (statistical) this many times")
    args = p.parse_args()
    raise SystemExit(asyncio.run(amain(args)))


if __name__ == "__main__":
    main()
