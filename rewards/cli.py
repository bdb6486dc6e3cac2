"""Look at the kernel environment by hand.

    python -m rewards.cli tasks [--levels 1 2] [--profile cpu]        # the task set and the split
    python -m rewards.cli prompt L1/12_softmax [--backend cuda]        # turn-1 messages
    python -m rewards.cli check response.txt [--backend cpu]           # parse + anti-hack rules only
    python -m rewards.cli evaluate L1/12_softmax response.txt          # full evaluation in the sandbox

``--config NAME`` picks conf/reward/NAME.yaml (default ``kernel``); ``--set key=value`` overrides.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from omegaconf.errors import OmegaConfBaseException

from rewards.config import load_reward_config
from rewards.env import KernelEnv
from rewards.parse import parse_response


def _cfg(args: argparse.Namespace) -> Any:
    overrides: dict[str, Any] = {}
    for item in args.set or []:
        if "=" not in item:
            raise SystemExit(f"--set {item!r}: expected key=value")
    if getattr(args, "backend", None):
        overrides["backend"] = args.backend
    if getattr(args, "profile", None):
        overrides["profile"] = args.profile
    if getattr(args, "levels", None):
        overrides["levels"] = [int(x) for x in args.levels]
    return load_reward_config(args.config, dotlist=list(args.set or []), **overrides)


def _read(path: str) -> str:
    return sys.stdin.read() if path == "-" else Path(path).read_text()


def cmd_tasks(args: argparse.Namespace) -> int:
    env = KernelEnv(_cfg(args), eval_pool=None)
    for split in ("train", "holdout"):
        refs = env.tasks(split)
        print(f"{split}: {len(refs)} tasks")
        for r in refs:
            print(f"  {r.task_id}")
    return 0


def cmd_prompt(args: argparse.Namespace) -> int:
    env = KernelEnv(_cfg(args), eval_pool=None)
    for m in env.messages(_ref(env, args.task), []):
        print(f"=== {m['role']} ===\n{m['content']}\n")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    cfg = _cfg(args)
    env = KernelEnv(cfg, eval_pool=None)
    parsed = parse_response(_read(args.response), max_chars=cfg.max_answer_chars)
    print(f"parse: {parsed.error_kind or 'ok'} {parsed.error}".rstrip())
    if parsed.code is None or parsed.error_kind == "syntax_error":
        return 1
    violations = env.check(parsed.code)
    for v in violations:
        print(f"rule {v.rule}: {v.reason}")
    if not violations:
        print(f"rules: all {len(cfg.rules.enabled)} enabled rules pass")
    return 1 if violations or not parsed.ok else 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from sandbox.config import load_default_config
    from sandbox.pool import EvalPool

    cfg = _cfg(args)

    async def run() -> Any:
        env = KernelEnv(cfg, EvalPool(load_default_config(backend=cfg.backend)))
        try:
            return await env.evaluate(_ref(env, args.task), _read(args.response))
        finally:
            await env.aclose()

    outcome = asyncio.run(run())
    if args.json:
        print(json.dumps(outcome.__dict__, indent=2, default=str))
    else:
        print(f"score {outcome.score:.4g}  correct={outcome.correct}  speedup={outcome.speedup}  "
              f"error_kind={outcome.error_kind}  hacks={outcome.hacks}\n\n{outcome.feedback}")
    return 0


def _ref(env: KernelEnv, task_id: str) -> Any:
    refs = {r.task_id: r for split in ("train", "holdout") for r in env.tasks(split)}
    if task_id not in refs:
        raise SystemExit(f"unknown task {task_id!r}; `python -m rewards.cli tasks` lists them")
    return refs[task_id]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewards.cli", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="kernel", help="conf/reward/<name>.yaml")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a reward config key")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tasks", help="list tasks by split")
    p.add_argument("--levels", nargs="+")
    p.add_argument("--profile", choices=["full", "cpu"])
    p = sub.add_parser("prompt", help="print turn-1 messages of a task")
    p.add_argument("task")
    p.add_argument("--backend", choices=["cpu", "triton", "cuda"])
    p = sub.add_parser("check", help="parse a response and apply the anti-hack rules")
    p.add_argument("response", help="file with the model response ('-' for stdin)")
    p.add_argument("--backend", choices=["cpu", "triton", "cuda"])
    p = sub.add_parser("evaluate", help="score a response in the sandbox")
    p.add_argument("task")
    p.add_argument("response")
    p.add_argument("--backend", choices=["cpu", "triton", "cuda"])
    p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    command = {"tasks": cmd_tasks, "prompt": cmd_prompt, "check": cmd_check, "evaluate": cmd_evaluate}[args.cmd]
    try:
        return command(args)
    except (OmegaConfBaseException, ValueError, FileNotFoundError) as e:  # config and task errors, for people
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
