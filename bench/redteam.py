"""The red team's answers (tests/sandbox/redteam.py) through ``sandbox.EvalPool`` on one backend:
each answer, then the task's correct answer in the same pool; a JSON file and a Markdown table
(answer, what it tries, expected, got, reason, as expected?).

    python -m bench.redteam --backend cpu --out /tmp/redteam_cpu.json
    python -m bench.redteam --backend cuda --out runs/bench/redteam_h200.json      # on a GPU box
    python -m bench.redteam --backend cpu --only A03,B10 --out /tmp/some.json

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
    host: dict[str, list[str]] = {}
    t0 = time.monotonic()
    overrides: dict[str, Any] = {}
    if args.backend != "cpu":
        overrides["memory_limit_bytes"] = 64 * 2**30
    try:
        async with EvalPool(rt.config(site.cache, run_timeout_s=args.run_timeout, **overrides)) as pool:
            for group in "ABC":
                for name in [n for n in wanted if rt.ANSWERS[n].group == group]:
                    a = rt.ANSWERS[name]
                    try:
                        o = await rt.evaluate(pool, site, name, args.backend)
                        problems = rt.problems(o, site, args.backend)
                        got, why, result = rt.got(o), rt.reason(o), o.result.to_dict()
                        follow = o.follow.to_dict()
                    except Exception as exc:  # noqa: BLE001 - one broken case must not end the run
                        problems, got, why, result, follow = [f"bench error: {exc!r}"], "bench error", repr(exc), {}, {}
                    expected, flag = a.expectation(args.backend)
                    row = {"answer": name, "group": group, "tries": a.tries,
                           "expected": expected + (f" [{flag}]" if flag else "")
                           + (f" (speedup <= {a.max_speedup})" if a.max_speedup else ""),
                           "got": got, "reason": why, "as_expected": not problems,
                           "known_hole": bool(a.hole), "problems": problems, "result": result, "follow": follow}
                    rows.append(row)
                    print(f"[bench.redteam] {name}: {got} -- {'ok' if not problems else problems}", flush=True)
                host[group] = site.host_problems()
                rt.cleanup_shm(site)
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
               "host_after_group": host, "wall_s": round(wall, 1)}
    md = table([{k: _cell(r[k]) for k in ("answer", "tries", "expected", "got", "reason")}
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


def _cell(text: Any) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--backend", default="cpu", choices=("cpu", "triton", "cuda"))
    p.add_argument("--only", default="", help="comma-separated name prefixes (A03,B1,...)")
    p.add_argument("--base", default=None, help="directory for the planted secrets and the pool's cache")
    p.add_argument("--keep", action="store_true", help="keep --base afterwards")
    p.add_argument("--run-timeout", type=float, default=20.0, help="run_timeout_s of each evaluation")
    args = p.parse_args()
    raise SystemExit(asyncio.run(amain(args)))


if __name__ == "__main__":
    main()
