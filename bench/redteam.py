"""The red team's answers (tests/sandbox/redteam.py) through ``sandbox.SandboxPool`` on one backend:
each answer (then the task's correct answer in the same pool); a JSON file and a Markdown table
(answer, what it tries, expected, got, reason, as expected?), and a progress line per answer.

    python -m bench.redteam --backend cpu --out /tmp/redteam_cpu.json
    python -m bench.redteam --backend cuda --out $OUT/redteam_cuda.json     # every answer, one H200, < 6 min
    python -m bench.redteam --backend cpu --only A03,B10 --out /tmp/some.json
    python -m bench.redteam --backend cpu --only A01 --adaptive 12 --out /tmp/adaptive.json  # the statistical cheat

CPU (the 2-core box, as tests/sandbox/test_redteam.py): the groups A, B, C in turn, each answer
followed by the correct answer, the timing-bound ones alone and pinned to one core, the rest two at
a time; ~3 min. A GPU backend: every answer in one queue, ``--parallel`` in flight (their workers
start Python and CUDA while another step holds the GPU: the device gate gives the GPU to one run
step at a time, so timings stay exclusive), answers with a build first, the timing-bound ones last
and ``--timing-alone`` at a time; the correct answer follows only the answers whose verdict is
judged against it (``--follow needed``), and one correct answer per task runs after all of them. ``--budget`` stops starting answers once that many seconds have
passed (those not started are listed as "not run"), so the JSON is written inside a call's limit.

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

from bench.common import machine, parser, set_overrides, table


async def amain(args: Any) -> int:
    from sandbox.pool import SandboxPool
    from tests.sandbox import redteam as rt

    gpu = args.backend != "cpu"
    parallel = args.parallel or (8 if gpu else 2)
    follow_each = (args.follow or ("needed" if gpu else "each")) == "each"
    queue = (args.schedule or ("queue" if gpu else "groups")) == "queue"
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
    progress = _Progress(len(wanted), t0)
    overrides: dict[str, Any] = {"compile_workers": args.compile_workers}
    # --set, e.g. zygote_gpu_steps=true: the red team against a setting before it is a default
    overrides.update(set_overrides(args.set))
    if queue:  # room for every answer in flight, a victim beside one of them, and a correct answer
        overrides["max_concurrent"] = parallel + 2
    if gpu:
        overrides["memory_limit_bytes"] = 64 * 2**30
    try:
        async with SandboxPool(rt.config(site.cache, run_timeout_s=args.run_timeout, **overrides)) as pool:
            used = {rt.ANSWERS[n].task for n in wanted}
            await rt.prime(pool, args.backend, tuple(t for t in ("relu", "tiny", "copy") if t in used))
            print(f"[bench.redteam] pool ready, references primed ({time.monotonic() - t0:.1f} s); "
                  f"{len(wanted)} answers, {parallel} in flight", flush=True)
            batches = [("all", wanted)] if queue else \
                [(g, [n for n in wanted if rt.ANSWERS[n].group == g]) for g in "ABC"]
            for label, names in batches:
                outcomes = await _run(pool, rt, site, names, args, parallel, follow_each, queue, t0, progress)
                rows += [_row(rt, site, name, outcomes[name], args.backend) for name in names]
                host[label] = site.host_problems()
                rt.cleanup_shm(site)
            if not follow_each:  # one correct answer per task, after every answer
                tasks = sorted({rt.ANSWERS[n].task for n in wanted})
                after = await asyncio.gather(*(pool.evaluate(rt.TASKS[t], rt.CORRECT[t], args.backend,
                                                             key=f"redteam-after-{t}") for t in tasks))
                for task, r in zip(tasks, after):
                    rows.append(_after_row(task, r))
                    print(f"[bench.redteam] correct answer to {task} after all: {_got(r)}", flush=True)
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
    answers = [r for r in rows if r["group"] != "after"]
    summary = {"answers": len(answers), "as_expected": sum(r["as_expected"] for r in answers),
               "not_run": [r["answer"] for r in answers if r["got"] == "not run"],
               "known_holes": [r["answer"] for r in answers if r["known_hole"]],
               "unexpected": [r["answer"] for r in rows if not r["as_expected"] and not r["known_hole"]],
               "host_after": host, "follow": "each" if follow_each else "needed", "parallel": parallel,
               "schedule": "queue" if queue else "groups",
               "adaptive_stale_cheat": adaptive, "wall_s": round(wall, 1), "sandbox_set": args.set}
    md = table([{"answer": r["answer"], "what it tries": _cell(r["tries"], 110), "expected": _cell(r["expected"]),
                 "got": _cell(r["got"]), "reason": _cell(r["reason"], 110)}
                | {"as expected": "yes" if r["as_expected"] else ("no (known hole)" if r["known_hole"] else "NO")}
                for r in rows])
    print(md)
    print(json.dumps(summary, indent=2))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": machine(), "backend": args.backend, "summary": summary,
                                   "rows": rows, "markdown": md}, indent=2, default=str))
        out.with_suffix(".md").write_text(f"# bench.redteam --backend {args.backend}\n\n{md}\n\n```json\n"
                                          f"{json.dumps(summary, indent=2, default=str)}\n```\n")
        print(f"[bench.redteam] wrote {out} and {out.with_suffix('.md')}")
    return 0 if not summary["unexpected"] and not any(host.values()) else 1


class _Progress:
    def __init__(self, total: int, t0: float):
        self.total, self.t0, self.done = total, t0, 0

    def __call__(self, name: str, text: str) -> None:
        self.done += 1
        print(f"[bench.redteam] {self.done}/{self.total} at {time.monotonic() - self.t0:.0f} s  {name}: {text}",
              flush=True)


async def _run(pool: Any, rt: Any, site: Any, names: list[str], args: Any, parallel: int, follow_each: bool,
               queue: bool, t0: float, progress: _Progress) -> dict[str, Any]:
    """Every answer of ``names``: an Outcome, an exception (the bench's, not the answer's) or None
    (not started: past ``--budget``). ``queue``: the rest ``parallel`` at a time, then the
    timing-bound ones ``--timing-alone`` at a time (their speedups are compared with a correct
    answer's, so no neighbour's start-up should share their cores); otherwise the timing-bound
    ones after the rest, alone, on one core (as the CPU tests run them)."""
    out: dict[str, Any] = {}
    gate = asyncio.Semaphore(parallel)

    async def one(name: str) -> None:
        async with gate:
            if time.monotonic() - t0 > args.budget:
                out[name] = None
                progress(name, "not run (past --budget)")
                return
            t = time.monotonic()
            try:
                o = await asyncio.wait_for(rt.evaluate(pool, site, name, args.backend, follow=follow_each),
                                           args.answer_timeout)
            except Exception as exc:  # noqa: BLE001 - one broken case must not end the run
                o = exc if not isinstance(exc, asyncio.TimeoutError) else \
                    TimeoutError(f"no verdict within --answer-timeout {args.answer_timeout:g} s")
            out[name] = o
            text = f"bench error {o!r}" if isinstance(o, Exception) else \
                f"{rt.got(o)} -- {rt.problems(o, site, args.backend) or 'ok'}"
            progress(name, f"{text} ({time.monotonic() - t:.1f} s)")
            if args.out:  # each row as it comes: a run cut short by its call's limit still leaves them
                with open(Path(args.out).with_suffix(".partial.jsonl"), "a") as f:
                    f.write(json.dumps(_row(rt, site, name, o, args.backend), default=str) + "\n")

    # builds take longest: started first, so they overlap the rest
    order = sorted(names, key=lambda n: "load_inline" not in rt.ANSWERS[n].source)
    if queue and not args.timing_alone:
        await asyncio.gather(*(one(n) for n in order))
        return out
    await asyncio.gather(*(one(n) for n in order if not rt.solo(n)))
    if queue:  # the timing-bound answers after the rest, few at a time: no neighbour shares their cores
        gate = asyncio.Semaphore(args.timing_alone)
        await asyncio.gather(*(one(n) for n in order if rt.solo(n)))
        return out
    gate = asyncio.Semaphore(1)
    with rt.one_core(True):
        for name in order:
            if rt.solo(name):
                await one(name)
    return out


def _row(rt: Any, site: Any, name: str, o: Any, backend: str) -> dict[str, Any]:
    a = rt.ANSWERS[name]
    if o is None:
        problems, got, why, result, follow = ["not run: past --budget"], "not run", "", {}, {}
    elif isinstance(o, Exception):
        problems, got, why, result, follow = [f"bench error: {o!r}"], "bench error", repr(o), {}, {}
    else:
        problems = rt.problems(o, site, backend)
        got, why, result = rt.got(o), rt.reason(o), o.result.to_dict()
        follow = o.follow.to_dict() if o.follow is not None else {}
    expected, flag = a.expectation(backend)
    return {"answer": name, "group": a.group, "tries": a.tries,
            "expected": expected.replace("|", " or ") + (f" [{flag}]" if flag else "")
            + (f" (speedup <= {a.max_speedup} x honest)" if a.max_speedup else ""),
            "got": got, "reason": why, "as_expected": not problems, "known_hole": bool(a.hole),
            "problems": problems, "result": result, "follow": follow, "new_ms": result.get("new_runtime_ms"),
            "ref_ms": result.get("ref_runtime_ms"), "honest_speedup": follow.get("speedup"),
            "seconds": getattr(o, "seconds", None)}


def _got(r: Any) -> str:
    return (f"correct (speedup {r.speedup:.2f})" if r.correct and r.speedup is not None else
            "correct" if r.correct else f"{r.error_kind}: {(r.error or '')[:160]}")


def _after_row(task: str, r: Any) -> dict[str, Any]:
    return {"answer": f"after_all_{task}", "group": "after",
            "tries": f"the correct answer to {task}, after every answer",
            "expected": "correct", "got": _got(r), "reason": "", "as_expected": bool(r.correct),
            "known_hole": False, "problems": [] if r.correct else [_got(r)], "result": r.to_dict(), "follow": {},
            "new_ms": r.new_runtime_ms, "ref_ms": r.ref_runtime_ms, "honest_speedup": r.speedup, "seconds": None}


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


def arguments() -> Any:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--backend", default="cpu", choices=("cpu", "triton", "cuda"))
    p.add_argument("--only", default="", help="comma-separated name prefixes (A03,B1,...)")
    p.add_argument("--base", default=None, help="directory for the planted secrets and the pool's cache")
    p.add_argument("--keep", action="store_true", help="keep --base afterwards")
    p.add_argument("--run-timeout", type=float, default=20.0, help="run_timeout_s of each evaluation")
    p.add_argument("--parallel", type=int, default=0,
                   help="answers in flight at once (default 2 on cpu, where timing-bound ones run alone; 8 on a GPU)")
    p.add_argument("--follow", choices=("each", "needed"), default=None,
                   help="the correct answer after every answer (cpu default), or only after those judged against "
                        "it plus one per task at the end (GPU default)")
    p.add_argument("--schedule", choices=("groups", "queue"), default=None,
                   help="groups A, B, C in turn with the timing-bound answers alone (cpu default), or every "
                        "answer in one queue (GPU default: the device gate keeps timings exclusive)")
    p.add_argument("--timing-alone", type=int, default=2,
                   help="queue schedule: the timing-bound answers run after the rest, this many at a time "
                        "(0: in the queue with the rest)")
    p.add_argument("--compile-workers", type=int, default=2, help="the pool's compile_workers")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="sandbox config override")
    p.add_argument("--budget", type=float, default=float("inf"),
                   help="seconds after which no answer is started (reported as not run)")
    p.add_argument("--answer-timeout", type=float, default=300.0,
                   help="wall limit of one answer with its correct answer (a bench error past it)")
    p.add_argument("--adaptive", type=int, default=0,
                   help="also run the adaptive stale cheat (statistical) this many times")
    return p


def main() -> None:
    raise SystemExit(asyncio.run(amain(arguments().parse_args())))


if __name__ == "__main__":
    main()
