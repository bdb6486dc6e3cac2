"""Look at the kernel environment by hand.

    python -m rewards.cli tasks [--levels 1 2] [--profile cpu]        # the task set and the split
    python -m rewards.cli prompt L1/12_softmax [--backend cuda] [--profile full]  # turn-1 messages
    python -m rewards.cli check response.txt [--backend cpu]           # parse + anti-hack rules only
    python -m rewards.cli score L1/12_softmax response.txt          # full evaluation in the sandbox

``--config NAME`` picks conf/reward/NAME.yaml (default ``kernel``); ``--set key=value`` overrides;
both go before or after the subcommand. Every command names the backend it used: the rules and
the evaluation differ per backend, and the default config's is ``cpu``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf.errors import OmegaConfBaseException

from rewards.config import load_reward_config
from rewards.env import KernelEnv
from rewards.parse import parse_response

if TYPE_CHECKING:
    from rewards.config import RewardConfig


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


def _backend_line(cfg: RewardConfig) -> str:
    return f"backend: {cfg.backend} (profile {cfg.profile}; --backend cpu|triton|cuda picks another)"


def cmd_prompt(args: argparse.Namespace) -> int:
    cfg = _cfg(args)
    print(_backend_line(cfg), file=sys.stderr)
    env = KernelEnv(cfg, eval_pool=None)
    for m in env.messages(_ref(env, args.task), []):
        print(f"=== {m['role']} ===\n{m['content']}\n")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    cfg = _cfg(args)
    print(_backend_line(cfg))
    env = KernelEnv(cfg, eval_pool=None)
    parsed = parse_response(_read(args.response), max_chars=cfg.max_answer_chars)
    print(f"parse: {parsed.error_kind or 'ok'} {parsed.error}".rstrip())
    if parsed.code is None or parsed.error_kind == "syntax_error":
        return 1
    violations = env.check(parsed.code)
    for v in violations:
        print(f"rule {v.rule}: {v.reason}")
    if not violations:
        print(f"rules: all {len(cfg.rules.enabled)} enabled rules pass (the {cfg.backend} backend's)")
        other = _looks_like(parsed.code)
        if other and other != cfg.backend:
            print(f"note: the answer looks like a {other} kernel; --backend {other} checks it "
                  f"against that backend's rules")
    return 1 if violations or not parsed.ok else 0


def cmd_score(args: argparse.Namespace) -> int:
    from sandbox.config import load_default_config
    from sandbox.pool import SandboxPool

    cfg = _cfg(args)

    async def run() -> Any:
        env = KernelEnv(cfg, SandboxPool(load_default_config(backend=cfg.backend)))
        try:
            return await env.score(_ref(env, args.task), _read(args.response))
        finally:
            await env.aclose()

    print(_backend_line(cfg), file=sys.stderr)
    outcome = asyncio.run(run())
    if args.json:
        print(json.dumps(outcome.__dict__, indent=2, default=str))
    else:
        print(f"score {outcome.score:.4g}  correct={outcome.correct}  speedup={outcome.speedup}  "
              f"error_kind={outcome.error_kind}  hacks={outcome.hacks}\n\n{outcome.feedback}")
    return 0


def _looks_like(code: str) -> str | None:
    """A guess at the backend an answer was written for (for a hint only, never a verdict)."""
    if "__global__" in code or "cuda_sources" in code:
        return "cuda"
    if "@triton.jit" in code:
        return "triton"
    return None


def _ref(env: KernelEnv, task_id: str) -> Any:
    refs = {r.task_id: r for split in ("train", "holdout") for r in env.tasks(split)}
    if task_id not in refs:
        raise SystemExit(f"unknown task {task_id!r}; `python -m rewards.cli tasks` lists them")
    return refs[task_id]


def main(argv: list[str] | None = None) -> int:
    def common(p: argparse.ArgumentParser, suffix: str) -> None:
        # the subcommands keep their own copies (dest *_after): argparse would otherwise let a
        # subcommand's --set replace the ones given before it; both are merged below
        p.add_argument("--config", dest="config" + suffix, default=None, help="conf/reward/<name>.yaml")
        p.add_argument("--set", dest="set" + suffix, action="append", default=None, metavar="KEY=VALUE",
                       help="override a reward config key (repeatable)")

    parser = argparse.ArgumentParser(prog="python -m rewards.cli", description=__doc__.split("\n\n")[0])
    common(parser, "")
    sub = parser.add_subparsers(dest="cmd", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        common(p, "_after")
        return p

    p = add("tasks", "list tasks by split")
    p.add_argument("--levels", nargs="+")
    p.add_argument("--profile", choices=["full", "cpu"])
    p = add("prompt", "print turn-1 messages of a task")
    p.add_argument("task")
    p.add_argument("--backend", choices=["cpu", "triton", "cuda"])
    p.add_argument("--profile", choices=["full", "cpu"], help="task sizes shown (cpu: CPU_SIZES)")
    p = add("check", "parse a response and apply the anti-hack rules")
    p.add_argument("response", help="file with the model response ('-' for stdin)")
    p.add_argument("--backend", choices=["cpu", "triton", "cuda"])
    p = add("score", "score a response in the sandbox")
    p.add_argument("task")
    p.add_argument("response")
    p.add_argument("--backend", choices=["cpu", "triton", "cuda"])
    p.add_argument("--profile", choices=["full", "cpu"], help="task sizes evaluated (cpu: CPU_SIZES)")
    p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.config = args.config_after or args.config or "kernel"
    args.set = (args.set or []) + (args.set_after or [])
    command = {"tasks": cmd_tasks, "prompt": cmd_prompt, "check": cmd_check, "score": cmd_score}[args.cmd]
    try:
        return command(args)
    except (OmegaConfBaseException, ValueError, FileNotFoundError) as e:  # config and task errors, for people
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
