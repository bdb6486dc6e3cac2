"""Evaluate one answer against one task, for people: ``python -m sandbox.eval --task T --answer A``.

Prints a readable verdict (or ``--json``). The exit code is 0 for any verdict, wrong answers
included; it is 2 only when the command itself is wrong (a missing file, a bad option).

It runs the sandbox alone: no anti-hack rules and the task file's sizes as written (a task's
``CPU_SIZES`` are applied by the reward env's cpu profile, not here). Both are said on stderr;
``python -m rewards.cli score`` scores an answer as training does.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from sandbox.config import BACKENDS, load_default_config
from sandbox.pool import SandboxPool
from sandbox.result import SandboxResult


def _read(path: str, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"sandbox.eval: --{what} {path!r} is not a file (expected a Python source file)")
    return p.read_text()


def format_verdict(r: SandboxResult) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f} ms"

    lines = [
        f"verdict   : {'CORRECT' if r.correct else 'NOT CORRECT'}" + (f" ({r.error_kind})" if r.error_kind else ""),
        f"stage     : {r.stage}    compiled: {r.compiled}    cache hit: {r.cache_hit}",
        f"backend   : {r.backend} on {r.device or '-'}",
        f"trials    : {r.trials_passed}/{r.trials} passed",
    ]
    if r.max_abs_err is not None:
        which = "" if r.which_output is None else f" (output {r.which_output})"
        lines.append(f"max error : abs {r.max_abs_err:.3g}, rel {r.max_rel_err:.3g}{which}")
    if r.timed:
        lines.append(f"runtime   : reference {ms(r.ref_runtime_ms)}, candidate {ms(r.new_runtime_ms)}, "
                     f"speedup {r.speedup:.3f}x")
    else:
        lines.append("runtime   : not timed" + (" (Triton interpreter: correctness only)"
                                                 if r.backend == "triton" and r.correct else ""))
    if r.flags:
        lines.append(f"flags     : {', '.join(r.flags)}")
    if r.error:
        lines.append("error     : " + r.error.strip().replace("\n", "\n            "))
    lines.append("wall (s)  : " + ", ".join(f"{k} {v:.2f}" for k, v in r.wall_s.items()))
    lines.append(f"isolation : {', '.join(r.isolation) or 'none'}")
    return "\n".join(lines)


def scope_notes(task: str) -> list[str]:
    """What this command does not do that a training reward does."""
    notes = ["note: sandbox.eval checks correctness and timing only; the anti-hack rules are not "
             "applied (python -m rewards.cli check/evaluate applies them)"]
    if "CPU_SIZES" in task:
        notes.append("note: the task's CPU_SIZES are ignored: it runs at the sizes its constants "
                     "give (python -m rewards.cli score --profile cpu uses CPU_SIZES)")
    return notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox.eval", description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True, help="KernelBench-format task file (class Model, get_inputs, ...)")
    ap.add_argument("--answer", required=True, help="answer file defining class ModelNew")
    ap.add_argument("--backend", choices=BACKENDS, default=None, help="default: sandbox.backend from the config")
    ap.add_argument("--json", action="store_true", help="print the SandboxResult as JSON")
    ap.add_argument("--trials", type=int, default=None, help="correctness trials")
    ap.add_argument("--runs", type=int, default=None, help="timed runs (median reported)")
    ap.add_argument("--cache-dir", default=None, help="compile cache (default: a temporary one)")
    ap.add_argument("--config", default=None, help="a sandbox YAML instead of conf/sandbox/default.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a sandbox config value (YAML syntax), repeatable")
    a = ap.parse_args(argv)
    task, answer = _read(a.task, "task"), _read(a.answer, "answer")
    overrides: dict[str, object] = {}
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"sandbox.eval: --set {item!r}: expected KEY=VALUE")
        import yaml

        overrides[key] = yaml.safe_load(value)
    if a.trials is not None:
        overrides["correctness_trials"] = a.trials
    if a.runs is not None:
        overrides["timing_runs"] = a.runs
    if a.cache_dir is not None:
        overrides["cache_dir"] = a.cache_dir
    cfg = load_default_config(a.config, **overrides)

    async def run() -> SandboxResult:
        async with SandboxPool(cfg) as pool:
            return await pool.evaluate(task, answer, a.backend)

    for line in scope_notes(task):
        print(line, file=sys.stderr)  # stderr: --json output stays one JSON document
    result = asyncio.run(run())
    print(json.dumps(result.to_dict(), indent=2) if a.json else format_verdict(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
