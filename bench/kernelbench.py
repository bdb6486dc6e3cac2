"""KernelBench through the sandbox (sandbox.pool.SandboxPool), trusted mode: no static rules.

Self-test (default): every task's reference is evaluated as its own candidate (the task source
plus ``class ModelNew(Model): pass``), so any verdict but "correct", or a speedup far from 1, is
the harness's doing, not a kernel's. Throughput (``--answers DIR``): our own CUDA answers, files
``<level>_<task file stem>.py``, a cold round (distinct builds) then a cached round.

    python -m bench.kernelbench --root .kb/KernelBench --levels 1 2 --backend cuda \
        --max-concurrent 8 --budget-s 300 --out bench/baselines/h200/kernelbench_selftest.json
    python -m bench.kernelbench --root .kb/KernelBench --answers bench/kernelbench_answers --backend cuda

Progress lines go to stderr; the markdown summary goes to stdout last (a device call's tail).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import fnmatch
import json
import re
import sys
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import fmt, machine, percentile, set_overrides, table

SELF_CANDIDATE = "\n\n# bench.kernelbench self-test: the reference is its own candidate\nclass ModelNew(Model):\n    pass\n"
BIG_BYTES = 10**9          # "inputs over 1 GB": such tasks also share --max-big run slots (host RAM)
# reported first; any other wall_s key the sandbox reports is added after them
# device_active: device_held less the wait for the exclusive window (admitted and idle meanwhile)
WALL_FIELDS = ("device_held", "device_active", "device_exclusive", "device_shared", "total", "reference",
               "correctness", "timing")
TARGETS = {"correct_share": 0.98, "speedup_lo": 0.9, "speedup_hi": 1.1, "evals_per_min": 30.0, "held_p50_level1_s": 1.5}
_FILE_RE = re.compile(r"^(\d+)_(.+)\.py$")
_ANSWER_RE = re.compile(r"^(\d+)_(\d+_.+)\.py$")


def log(msg: str) -> None:
    print(f"[bench.kernelbench] {msg}", file=sys.stderr, flush=True)


def level_dir(root: Path, level: int) -> Path:
    # accept the checkout's top level too (root/KernelBench/levelN), as rewards.tasks.loader does
    for d in (root / f"level{level}", root / "KernelBench" / f"level{level}"):
        if d.is_dir():
            return d
    raise SystemExit(f"{root}: no level{level}/ (nor KernelBench/level{level}/)")


def discover(root: Path, levels: list[int], pattern: str | None, limit: int | None) -> list[dict[str, Any]]:
    """Task records, interleaved across levels (L1/1, L2/1, L1/2, ...): a run cut by its budget
    still covers every level alike. ``limit`` is per level."""
    out = []
    for level in levels:
        files = sorted((int(m.group(1)), p) for p in level_dir(root, level).iterdir()
                       if (m := _FILE_RE.match(p.name)) and p.is_file())
        files = [(n, p) for n, p in files if not pattern or fnmatch.fnmatch(p.name, pattern)
                 or fnmatch.fnmatch(f"level{level}/{p.name}", pattern)][:limit]
        out += [{"task": f"L{level}/{p.stem}", "level": level, "number": n, "path": str(p)} for n, p in files]
    return sorted(out, key=lambda r: (r["number"], r["level"]))


def nbytes(x: Any) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(nbytes(v) for v in x)
    return 0


def inspect_task(rec: dict[str, Any]) -> None:
    """Load check, then the input/output footprint on the meta device (no memory, no time): which
    tasks would draw gigabytes on the host before the sandbox moves them to the GPU."""
    try:
        src = Path(rec["path"]).read_text()
        mod = types.ModuleType(f"kb_{rec['level']}_{rec['number']}")
        exec(compile(src, rec["path"], "exec"), mod.__dict__)  # trusted: KernelBench's own files
        missing = [a for a in ("Model", "get_inputs", "get_init_inputs") if not hasattr(mod, a)]
        if missing:
            raise ValueError(f"defines no {', '.join(missing)}")
        rec["src"] = src
    except BaseException as exc:  # noqa: BLE001 - a broken task file is a row, never a crash
        rec.update(verdict="load_failed", error=f"{type(exc).__name__}: {exc}"[:200])
        return
    try:
        from sandbox.footprint import measure

        fp = measure(src, rec["path"])
        rec.update(input_bytes=fp.input_bytes, param_bytes=fp.param_bytes)
        if fp.output_bytes is None:
            rec["footprint_error"] = "the forward has no meta kernel"
        else:
            rec["output_bytes"] = fp.output_bytes
    except Exception as exc:  # noqa: BLE001 - e.g. an op without a meta kernel: footprint unknown
        rec["footprint_error"] = f"{type(exc).__name__}: {exc}"[:200]


def sandbox_config(args: argparse.Namespace) -> Any:
    from sandbox.config import load_default_config

    overrides = set_overrides(args.set)
    overrides["backend"] = args.backend
    if args.max_concurrent:
        overrides["max_concurrent"] = args.max_concurrent
    return load_default_config(**overrides)


async def evaluate_all(pool: Any, items: list[dict[str, Any]], backend: str, args: argparse.Namespace,
                       deadline: float | None, phase: str) -> float:
    """Evaluate every item (``ref``, ``cand``) concurrently; returns the phase's wall seconds.
    Our own launch gate (the pool's size) lets us stop launching once the budget is spent, and
    keeps the evaluations of >1 GB-input tasks to --max-big at once (each draws its inputs on the
    host: 6 GB+ per copy for many level-1 tasks)."""
    launch, big = asyncio.Semaphore(pool.cfg.max_concurrent), asyncio.Semaphore(args.max_big)
    t0, done = time.monotonic(), 0

    async def one(i: int, it: dict[str, Any]) -> None:
        nonlocal done
        async with launch:
            gate = big if (it.get("input_bytes") or 0) > BIG_BYTES else contextlib.nullcontext()
            async with gate:
                if deadline is not None and time.monotonic() > deadline:
                    it["verdict"] = "not_run"
                    return
                t = time.monotonic()
                it["verdict"] = "cancelled"  # stays if the drain limit cancels it
                res = await pool.evaluate(it["ref"], it["cand"], backend, key=f"kb-{phase}-{i}")
        if "device_held" in res.wall_s:
            res.wall_s["device_active"] = round(res.wall_s["device_held"] - res.wall_s.get("exclusive_wait", 0.0), 3)
        it.update(verdict="correct" if res.correct else (res.error_kind or "not_correct"),
                  error_kind=res.error_kind, error=(res.error or "")[:200] or None, speedup=res.speedup,
                  ref_ms=res.ref_runtime_ms, new_ms=res.new_runtime_ms, cache_hit=res.cache_hit,
                  wall_s=res.wall_s, flags=res.flags, seconds=round(time.monotonic() - t, 2),
                  # when it ran, from the phase's start: with wall_s, who overlapped whom on the device
                  t_start_s=round(t - t0, 2), t_end_s=round(time.monotonic() - t0, 2))
        done += 1
        log(f"{phase} {done}/{len(items)} {it['task']}: {it['verdict']} speedup={fmt(res.speedup)} "
            f"{it['seconds']:.1f}s" + (f" | {it['error'][:120]!r}" if it["error"] else ""))

    tasks = [asyncio.ensure_future(one(i, it)) for i, it in enumerate(items)]
    # in-flight evaluations get --drain-s past the budget, then are cancelled (the pool kills them)
    _, pending = await asyncio.wait(tasks, timeout=None if deadline is None
                                    else max(1.0, deadline + args.drain_s - time.monotonic()))
    for t in pending:
        t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for it, r in zip(items, results):
        if isinstance(r, Exception):  # a bench bug, not a verdict: keep it visible
            it.update(verdict="bench_error", error=repr(r)[:200])
    return time.monotonic() - t0


def dist(values: list[float]) -> dict[str, float]:
    return {"p10": percentile(values, 10), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "n": len(values)}


def wall_dist(recs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    seen = sorted({k for r in recs for k in r.get("wall_s", {})} - set(WALL_FIELDS))
    return {f: dist([r["wall_s"][f] for r in recs if f in r.get("wall_s", {})]) for f in (*WALL_FIELDS, *seen)}


def device_use(recs: list[dict[str, Any]]) -> dict[str, float]:
    """Where the device's time went over the run's span (first start to last end): the share of it
    inside some step's exclusive window, and how many shared sections ran at once on average
    outside those windows (sums of each record's windows: they never overlap an exclusive one)."""
    timed = [r for r in recs if "t_start_s" in r and "wall_s" in r]
    if not timed:
        return {}
    span = max(r["t_end_s"] for r in timed) - min(r["t_start_s"] for r in timed)
    excl = sum(r["wall_s"].get("device_exclusive", 0.0) for r in timed)
    shared = sum(r["wall_s"].get("device_shared", 0.0) for r in timed)
    rest = span - excl
    return {"span_s": span, "exclusive_share": excl / span if span > 0 else float("nan"),
            "shared_concurrency": shared / rest if rest > 0 else float("nan"),
            "exclusive_s_per_eval": excl / len(timed)}


def failures(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"task": r["task"], "verdict": r["verdict"], "error_kind": r.get("error_kind"),
             "input_GB": round(r["input_bytes"] / 1e9, 2) if r.get("input_bytes") is not None else None,
             "error": (r.get("error") or "")[:200].replace("\n", " ").replace("|", "/")}  # one table cell
            for r in recs if r.get("verdict") not in (None, "correct", "not_run")]


async def selftest(args: argparse.Namespace, recs: list[dict[str, Any]], deadline: float | None) -> dict[str, Any]:
    from sandbox.pool import SandboxPool

    todo = [r for r in recs if "src" in r]
    for r in todo:
        r.update(ref=r["src"], cand=r["src"] + SELF_CANDIDATE + r.get("copy", ""))
    async with SandboxPool(sandbox_config(args)) as pool:
        wall = await evaluate_all(pool, todo, args.backend, args, deadline, "self")
        stats = pool.stats()
    ran = [r for r in recs if r.get("verdict") not in ("not_run", "cancelled")]
    ok = [r for r in ran if r["verdict"] == "correct"]
    speed = [r["speedup"] for r in ok if r.get("speedup") is not None]
    evaluated = [r for r in todo if "wall_s" in r]
    share = len(ok) / len(ran) if ran else float("nan")
    med = percentile(speed, 50)
    loaded = [r for r in ran if r["verdict"] != "load_failed"]  # a broken task file is not the harness's fault
    rate = len(evaluated) / wall * 60 if wall > 0 else float("nan")
    by_level = {f"L{lv}": {f: dist([r["wall_s"][f] for r in evaluated if r["level"] == lv and f in r["wall_s"]])
                           for f in ("device_held", "device_active", "device_exclusive", "device_shared")}
                for lv in sorted({r["level"] for r in evaluated})}
    held_l1 = by_level.get("L1", {}).get("device_held", {}).get("p50", float("nan"))
    return {"tasks": len(recs), "attempted": len(ran), "correct": len(ok), "correct_share": share,
            "correct_share_loaded": len(ok) / len(loaded) if loaded else float("nan"),
            "target_correct_share_ge_98pct": "met" if share >= TARGETS["correct_share"] else "MISSED",
            "speedup": dist(speed),
            "target_median_speedup_0.9_1.1": "n/a" if not speed else
            ("met" if TARGETS["speedup_lo"] <= med <= TARGETS["speedup_hi"] else "MISSED"),
            "wall_s": wall_dist(evaluated), "phase_wall_s": wall, "wall_s_by_level": by_level,
            "device_use": device_use(evaluated),
            "evals_per_min": rate,
            "target_evals_per_min_ge_30": "met" if rate >= TARGETS["evals_per_min"] else "MISSED",
            "target_held_p50_level1_le_1.5s": "n/a" if held_l1 != held_l1 else
            ("met" if held_l1 <= TARGETS["held_p50_level1_s"] else "MISSED"),
            "reran_alone": sum(1 for r in evaluated if r["wall_s"].get("reran_alone")),
            "not_run": [r["task"] for r in recs if r.get("verdict") == "not_run"],
            "cancelled": [r["task"] for r in recs if r.get("verdict") == "cancelled"],
            "failures": failures(recs), "failure_kinds": dict(Counter(f["verdict"] for f in failures(recs))),
            "pool_stats": stats}


async def throughput(args: argparse.Namespace, recs: list[dict[str, Any]], deadline: float | None) -> dict[str, Any]:
    from sandbox.pool import SandboxPool

    phases: list[dict[str, Any]] = []
    rows, fails = [], failures(recs)
    async with SandboxPool(sandbox_config(args)) as pool:
        for phase in ["cold"] + [f"cached{k}" for k in range(1, args.cached_rounds + 1)]:
            items = [{**r, "ref": r["src"], "cand": f"# bench variant {v}\n{r['answer']}", "task": f"{r['task']}#{v}"}
                     for r in recs if "src" in r for v in range(args.variants)]
            wall = await evaluate_all(pool, items, args.backend, args, deadline, phase)
            ev = [i for i in items if "wall_s" in i]
            hits = [i for i in ev if i.get("cache_hit")]
            held = [i["wall_s"]["device_held"] for i in ev if "device_held" in i["wall_s"]]
            rows.append({"phase": phase, "evals": len(ev), "correct": sum(i["verdict"] == "correct" for i in ev),
                         "not_run": sum(i["verdict"] == "not_run" for i in items), "cache_hits": len(hits),
                         "wall_s": wall, "evals_per_min": len(ev) / wall * 60 if wall > 0 else float("nan"),
                         "compile_p50_s": percentile([i["wall_s"]["compile"] for i in ev if "compile" in i["wall_s"]], 50),
                         "hit_total_p50_s": percentile([i["wall_s"]["total"] for i in hits], 50),
                         "hit_load_p50_s": percentile([i["wall_s"]["load"] for i in hits if "load" in i["wall_s"]], 50),
                         "held_p10_s": percentile(held, 10), "held_p50_s": percentile(held, 50),
                         "held_p90_s": percentile(held, 90)})
            log("phase " + "  ".join(f"{k}={fmt(v)}" for k, v in rows[-1].items()))
            phases.append({"phase": phase, "records": [{k: v for k, v in i.items() if k not in ("src", "ref", "cand", "answer")}
                                                       for i in items], "wall_s_dist": wall_dist(ev)})
            fails += [{"phase": phase, **f} for f in failures(items)]
        stats = pool.stats()
    return {"rows": rows, "phases": phases, "failures": fails, "pool_stats": stats}


def answer_records(root: Path, answers: Path) -> list[dict[str, Any]]:
    recs = []
    for p in sorted(answers.glob("*.py")):
        m = _ANSWER_RE.match(p.name)
        if not m:
            continue
        level, stem = int(m.group(1)), m.group(2)
        task = level_dir(root, level) / f"{stem}.py"
        rec = {"task": f"L{level}/{stem}", "level": level, "number": int(stem.split("_")[0]), "path": str(task),
               "answer_file": p.name, "answer": p.read_text()}
        if task.is_file():
            inspect_task(rec)
        else:
            rec.update(verdict="load_failed", error=f"no task file {task}")
        recs.append(rec)
    return recs


def footprint_summary(recs: list[dict[str, Any]]) -> dict[str, Any]:
    ins = [r["input_bytes"] for r in recs if r.get("input_bytes") is not None]
    outs = [r["output_bytes"] for r in recs if r.get("output_bytes") is not None]
    params = [r.get("param_bytes", 0) for r in recs]
    return {"measured": len(ins), "inputs_over_1GB": sum(b > BIG_BYTES for b in ins),
            "input_GB": {k: v / 1e9 for k, v in dist(ins).items() if k != "n"},
            "outputs_over_1GB": sum(b > BIG_BYTES for b in outs), "params_over_1GB": sum(b > BIG_BYTES for b in params),
            "input_GB_max": max(ins, default=0) / 1e9, "output_GB_max": max(outs, default=0) / 1e9,
            "param_GB_max": max(params, default=0) / 1e9,
            "forward_on_meta_failed": sum("footprint_error" in r for r in recs if "src" in r)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, help="dir with level1/ level2/ ... (or a KernelBench checkout)")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    p.add_argument("--limit", type=int, default=None, help="at most N tasks per level")
    p.add_argument("--tasks", default=None, help="glob on the file name (or levelN/name)")
    p.add_argument("--skip-done", default=None, help="a JSON of an earlier run: skip the tasks it evaluated")
    p.add_argument("--limit-total", type=int, default=None, help="with --skip-done: at most N tasks")
    p.add_argument("--backend", default="cuda", choices=["cuda", "cpu", "triton"])
    p.add_argument("--out", default=None)
    p.add_argument("--max-concurrent", type=int, default=None)
    p.add_argument("--max-big", type=int, default=2, help="evaluations of >1 GB-input tasks at once")
    p.add_argument("--budget-s", type=float, default=None, help="stop launching evaluations after this")
    p.add_argument("--drain-s", type=float, default=60.0, help="then wait this long for those in flight")
    p.add_argument("--order", default="interleave", choices=["interleave", "small-first"],
                   help="interleave: L1/1, L2/1, L1/2, ...; small-first: by meta-device footprint")
    p.add_argument("--answers", default=None, help="throughput mode: dir of <level>_<stem>.py answers")
    p.add_argument("--variants", type=int, default=1, help="answers mode: distinct copies (builds) per answer")
    p.add_argument("--cached-rounds", type=int, default=1)
    p.add_argument("--footprint-only", action="store_true", help="meta-device footprint only, no sandbox")
    p.add_argument("--answers-per-task", type=int, default=1,
                   help="selftest: N distinct answers (the reference as candidate, each its own source) to each "
                        "task, launched together as a group of rollouts is")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="sandbox config override")
    p.add_argument("--estimate-without-peak", action="store_true",
                   help="A/B only: admit first steps on the estimate without the forward's measured peak "
                        "(three outputs' worth per runner and the poison on top, as before 2026-12-04 17:00)")
    args = p.parse_args(argv)
    if args.estimate_without_peak:
        import sandbox.devices

        measured = sandbox.devices.estimate
        sandbox.devices.estimate = lambda fp, cfg: measured({**fp, "peak_bytes": None}, cfg)  # pool's own process
    t0 = time.monotonic()
    deadline = t0 + args.budget_s if args.budget_s else None
    root = Path(args.root)
    if args.answers:
        recs = answer_records(root, Path(args.answers))
    else:
        recs = discover(root, args.levels, args.tasks, args.limit)
        if args.skip_done:  # resume: only what an earlier run (cut by its budget) did not evaluate
            done = {r["task"] for r in json.loads(Path(args.skip_done).read_text())["records"]
                    if r.get("verdict") not in (None, "not_run", "cancelled")}
            recs = [r for r in recs if r["task"] not in done]
            recs = recs[:args.limit_total] if args.limit_total else recs
        for r in recs:
            inspect_task(r)
        if args.order == "small-first":  # most tasks inside a budget; the big ones are the not-run list
            recs.sort(key=lambda r: r.get("input_bytes", 0) + (r.get("output_bytes") or 0))
    fp = footprint_summary(recs)
    log(f"{len(recs)} tasks, footprint {json.dumps(fp)} in {time.monotonic() - t0:.1f}s")
    if not args.answers and args.answers_per_task > 1:
        # distinct answers to each task launched together, as a group of rollouts arrives: the
        # regime of the RL loop, where a task's reference time and footprint are measured once
        recs = [{**r, "task": f"{r['task']}#{k}", "copy": f"\n# answer {k}\n"} if "src" in r else r
                for r in recs for k in range(args.answers_per_task if "src" in r else 1)]
    result: dict[str, Any] = {"bench": "kernelbench", "mode": "answers" if args.answers else "selftest",
                              "machine": machine(), "command": " ".join(["python -m bench.kernelbench"] + sys.argv[1:]),
                              "args": vars(args), "footprint": fp}
    if not args.footprint_only:
        run = throughput if args.answers else selftest
        result["summary"] = asyncio.run(run(args, recs, deadline))
    result["records"] = [{k: v for k, v in r.items() if k not in ("src", "ref", "cand", "answer", "copy")}
                         for r in recs]
    result["elapsed_s"] = time.monotonic() - t0
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print_report(result)
    return result


def print_report(result: dict[str, Any], max_rows: int = 40) -> None:
    """Failures first, the summary last: a device call's output tail keeps the summary."""
    s, fp = result.get("summary", {}), result["footprint"]
    if s:
        fails = s["failures"]
        print(f"### not correct ({len(fails)}" + (f", first {max_rows}; all in the JSON)" if len(fails) > max_rows else ")"))
        print(table(fails[:max_rows]) if fails else "(none)")
        print("\npool.stats(): " + ", ".join(f"{k}={fmt(v)}" for k, v in sorted(s["pool_stats"].items())))
    print(f"\n## bench.kernelbench {result['mode']} on {result['machine'].get('gpu', 'CPU')} "
          f"({result['machine']['cpus']} cpus, {result['machine']['date_utc']} UTC)")
    print(f"footprint (meta device): {fp['measured']} measured, {fp['inputs_over_1GB']} with inputs > 1 GB, "
          f"input GB p50 {fmt(fp['input_GB']['p50'])} max {fmt(fp['input_GB_max'])}, outputs > 1 GB: "
          f"{fp['outputs_over_1GB']}, parameters > 1 GB: {fp['params_over_1GB']}, "
          f"forward on meta failed: {fp['forward_on_meta_failed']}")
    if result["mode"] == "selftest" and s:
        rows = [{"metric": "correct share", "value": f"{s['correct']}/{s['attempted']} = {fmt(s['correct_share'])}",
                 "target": f">= 0.98: {s['target_correct_share_ge_98pct']}"},
                {"metric": "correct share (task files that load)", "value": fmt(s["correct_share_loaded"]), "target": ""},
                {"metric": "not correct by verdict", "value": json.dumps(s["failure_kinds"]), "target": ""},
                {"metric": "speedup p10/p50/p90", "value": "/".join(fmt(s["speedup"][q]) for q in ("p10", "p50", "p90")),
                 "target": f"p50 in [0.9, 1.1]: {s['target_median_speedup_0.9_1.1']}"},
                {"metric": "evals/min", "value": fmt(s["evals_per_min"]),
                 "target": f">= 30: {s['target_evals_per_min_ge_30']}"},
                {"metric": "re-run alone (timeout/OOM while sharing)", "value": str(s["reran_alone"]), "target": ""},
                {"metric": "device: exclusive share of span / shared at once / exclusive s per eval",
                 "value": "/".join(fmt(s.get("device_use", {}).get(k, float("nan")))
                                   for k in ("exclusive_share", "shared_concurrency", "exclusive_s_per_eval")),
                 "target": ""},
                {"metric": "not run (budget) / cancelled", "value": f"{len(s['not_run'])} / {len(s['cancelled'])}",
                 "target": ""}]
        for level, fields in s["wall_s_by_level"].items():
            for f, d in fields.items():
                target = (f"p50 <= 1.5 s: {s['target_held_p50_level1_le_1.5s']}"
                          if (level, f) == ("L1", "device_held") else "")
                rows.append({"metric": f"{level} wall_s.{f} p10/p50/p90",
                             "value": "/".join(fmt(d[q]) for q in ("p10", "p50", "p90")),
                             "target": f"{target} n={d['n']}".strip()})
        rows += [{"metric": f"wall_s.{f} p10/p50/p90", "value": "/".join(fmt(d[q]) for q in ("p10", "p50", "p90")),
                  "target": f"n={d['n']}"} for f, d in s["wall_s"].items()]
        print(table(rows), flush=True)
    elif s:
        print(table(s["rows"]), flush=True)


if __name__ == "__main__":
    main()
