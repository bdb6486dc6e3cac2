"""Streaming rewards against evaluate-all-at-the-end, on the same batch of answers.

A generated batch is replayed: answer i is "finished" at time t_i, spread uniformly over the
generation window (``--gen-seconds``). Streaming hands each answer to ``sandbox.SandboxPool`` at its
t_i (what pipeline.rollout does); at-the-end hands all of them over when the last token is out
(verl's synchronous shape). Reward tail = last score - last token; total = last score - first
token. Each mode gets its own empty build cache and its own distinct builds, so neither profits
from the other's compiles. Target: streaming tail <= p95 of a single evaluation.

Answers: ``--compiled`` known-correct kernels (distinct builds) and ``--cheap`` answers that need
no build (plain-torch ModelNew: a quick verdict, as parse failures and rule hits are in a batch).

    python -m bench.reward_streaming --backend cpu --compiled 2 --cheap 6 --gen-seconds 60
    python -m bench.reward_streaming --backend cuda --compiled 24 --cheap 24 --gen-seconds 60
"""
from __future__ import annotations

import asyncio
import random
import tempfile
import time
from typing import Any

from bench.common import parser, percentile, progress, report, target
from bench.sandbox import candidates

CHEAP_ANSWER = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n" \
               "        return x.clamp_min(0.0)  # variant {k}\n"


def batch(backend: str, compiled: int, cheap: int, nonce: str) -> list[tuple[str, str]]:
    """(reference, answer) pairs; ``nonce`` makes this mode's builds distinct from the other's."""
    from rewards.tasks.loader import load_builtin

    out = [(ref, f"# {nonce}\n{cand}") for _, ref, cand in candidates(backend, compiled)]
    relu = next(t for t in load_builtin(levels=(1,), profile="cpu" if backend == "cpu" else "full")
                if t.id == "L1/17_relu")
    out += [(relu.source, CHEAP_ANSWER.format(k=f"{nonce}-{k}")) for k in range(cheap)]
    return out


async def replay(cfg: Any, work: list[tuple[str, str]], finish: list[float], streaming: bool,
                 backend: str) -> dict[str, Any]:
    from sandbox.pool import SandboxPool

    durations: list[float] = []
    async with SandboxPool(cfg) as pool:
        t0 = time.monotonic()
        last_token = max(finish)

        async def one(i: int) -> float:
            await asyncio.sleep(max(0.0, (finish[i] if streaming else last_token) - (time.monotonic() - t0)))
            s = time.monotonic()
            r = await pool.evaluate(work[i][0], work[i][1], backend, key=f"r{i}")
            durations.append(time.monotonic() - s)
            # one line per verdict, so a run cut at its time limit still shows how far it got
            print(f"[reward_streaming] {'streaming' if streaming else 'at_end'} {len(durations)}/{len(work)} "
                  f"answer {i} at {time.monotonic() - t0:.1f}s: {r.error_kind or 'correct'} "
                  f"eval {durations[-1]:.1f}s device_held {r.wall_s.get('device_held', '-')}", flush=True)
            if not r.correct:
                print(f"[reward_streaming] answer {i} not correct: {r.error_kind} {(r.error or '')[:200]}")
            return time.monotonic() - t0

        done = await asyncio.gather(*[one(i) for i in range(len(work))])
    last_score = max(done)
    return {"mode": "streaming" if streaming else "at_end", "answers": len(work),
            "gen_window_s": last_token, "reward_tail_s": last_score - last_token, "total_s": last_score,
            "eval_p50_s": percentile(durations, 50), "eval_p95_s": percentile(durations, 95)}


async def amain(args: Any) -> None:
    from sandbox.config import load_default_config

    rng = random.Random(args.seed)
    n = args.compiled + args.cheap
    finish = sorted(rng.uniform(0, args.gen_seconds) for _ in range(n))
    finish[-1] = args.gen_seconds
    order = list(range(n))
    rng.shuffle(order)  # compiled and cheap answers finish in mixed order
    rows = []
    for streaming in (True, False):
        nonce = f"mode-{'s' if streaming else 'e'}-{time.time_ns()}"
        work = batch(args.backend, args.compiled, args.cheap, nonce)
        work = [work[i] for i in order]
        overrides: dict[str, Any] = {"backend": args.backend, "cache_dir": tempfile.mkdtemp(prefix="bench_rs_")}
        for key in ("max_concurrent", "compile_workers"):
            if getattr(args, key) is not None:
                overrides[key] = getattr(args, key)
        rows.append(await replay(load_default_config(**overrides), work, finish, streaming, args.backend))
        progress("reward_streaming", rows[-1])
    s, e = rows
    extra = {"backend": args.backend, "tail_saved_s": e["reward_tail_s"] - s["reward_tail_s"],
             "total_speedup": e["total_s"] / s["total_s"] if s["total_s"] else float("nan"),
             "target_tail_le_p95_single_eval": target(s["reward_tail_s"] <= s["eval_p95_s"])}
    report("reward_streaming", args, rows, extra)


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "triton"])
    p.add_argument("--compiled", type=int, default=2)
    p.add_argument("--cheap", type=int, default=6)
    p.add_argument("--gen-seconds", type=float, default=60.0)
    p.add_argument("--max-concurrent", dest="max_concurrent", type=int, default=None)
    p.add_argument("--compile-workers", dest="compile_workers", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(amain(p.parse_args()))


if __name__ == "__main__":
    main()
