"""Sampler overhead: tokens/s of a generation engine alone, through the episode driver
(``pipeline.rollout.stream_episodes``, in process) and through a ``SamplerWorker`` Ray actor
(``SamplerGroup``: the whole sampling path the loop uses), on the same requests. With vLLM the
first row is bare vLLM: ``LLM.generate`` of the same engine object on the same token-id prompts
with the same sampling parameters, the reference every overhead is taken against.

Requests: ``--tasks`` ToyEnv tasks x ``--trajectories``, one turn each, ``--max-tokens`` per
response, temperature 1. ToyEnv scores in microseconds, so what is measured is the wrappers'
cost, not an environment's. Overhead = 1 - tokens/s(wrapper) / tokens/s(engine) of the fastest
runs, and the median over rounds of the same ratio taken within each round (the in-process paths
run interleaved, one run of each per round). Target <= 5 %, judged on the paired median.
Every path's timed window holds the same work from prompt messages to the last token (the engine
path tokenises its prompts inside it too), and every path first runs the full request set once
untimed through itself (first batch of that size, a fresh actor's first calls).

    python -m bench.sampler --engine hf --preset tiny --max-tokens 64          # CPU
    python -m bench.sampler --engine vllm --preset qwen0.5b --max-tokens 512   # the H200
    python -m bench.sampler --engine hf --preset qwen0.5b --dtype bfloat16 --max-tokens 512  # fallback
"""
from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
from typing import Any

from bench.common import parser, progress, report, target

PRESETS = {
    "tiny": [],
    "tiny-tied": ["tiny.tie_word_embeddings=true"],
    "qwen0.5b": ["tiny.vocab_size=151936", "tiny.hidden_size=896", "tiny.intermediate_size=4864",
                 "tiny.num_hidden_layers=24", "tiny.num_attention_heads=14", "tiny.num_key_value_heads=2",
                 "tiny.tie_word_embeddings=true", "tiny.max_position_embeddings=32768"],
}
# the same shape with its own lm_head (630 M parameters), for comparing against untied checkpoints
PRESETS["qwen0.5b-untied"] = [o for o in PRESETS["qwen0.5b"] if "tie_word" not in o] + \
    ["tiny.tie_word_embeddings=false"]


def configs(args: Any) -> tuple[Any, Any]:
    from pipeline.models.load import load_model_config
    from pipeline.rollout_config import load_rollout_config

    model = load_model_config("tiny", PRESETS[args.preset] + [f"dtype={args.dtype}"])
    over = [f"n_trajectories={args.trajectories}", "turns=1", "temperature=1.0",
            f"max_response_length={args.max_tokens}", "response_length_schedule=[]",
            f"engine.max_inflight={args.max_inflight}", f"stream_buffer={args.stream_buffer}"]
    if args.engine == "vllm":
        over += [f"engine.vllm.gpu_memory_utilization={args.gpu_memory_utilization}",
                 f"engine.vllm.max_model_len={args.max_model_len}", "engine.vllm.enable_sleep_mode=false"]
    else:
        over += [f"engine.hf.max_batch_size={args.hf_batch}"]
    return model, load_rollout_config(args.engine, over)


def toy_tasks(n: int) -> tuple[Any, list[Any]]:
    from rewards.toy import ToyEnv

    env = ToyEnv(n_tasks=n)
    return env, env.tasks("train")


async def engine_alone(engine: Any, tokenizer: Any, env: Any, tasks: list[Any], rollout: Any) -> tuple[int, float]:
    from pipeline.engines import SamplingParams
    from pipeline.rollout import build_prompt

    params = SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                            max_tokens=rollout.max_response_length)
    t0 = time.perf_counter()
    prompts = [build_prompt(tokenizer, env.messages(t, [])) for t in tasks for _ in range(rollout.n_trajectories)]
    gens = await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    wall = time.perf_counter() - t0
    return sum(len(g.token_ids) for g in gens), wall


async def bare_vllm(engine: Any, tokenizer: Any, env: Any, tasks: list[Any], rollout: Any) -> tuple[int, float]:
    """``LLM.generate`` on the engine's own ``LLM`` (its thread runs it between two steps, while
    nothing else is queued): the same prompts and ``vllm.SamplingParams`` as ``engine_alone``."""
    from pipeline.engines import SamplingParams
    from pipeline.rollout import build_prompt

    params = SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                            max_tokens=rollout.max_response_length)
    t0 = time.perf_counter()
    # vllm.inputs.TokensPrompt is a TypedDict: this dict is one
    prompts = [{"prompt_token_ids": build_prompt(tokenizer, env.messages(t, []))}
               for t in tasks for _ in range(rollout.n_trajectories)]
    vparams = engine._sampling_params(params)
    outs = await asyncio.to_thread(engine._call, lambda: engine.llm.generate(prompts, vparams, use_tqdm=False))
    wall = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs), wall


async def through_rollout(engine: Any, tokenizer: Any, env: Any, tasks: list[Any], rollout: Any,
                          step: int) -> tuple[int, float]:
    from pipeline.rollout import stream_episodes

    t0 = time.perf_counter()
    tokens = 0
    async for s in stream_episodes(engine, tokenizer, env, tasks, step, 0, rollout):
        tokens += len(s.response_ids)
    return tokens, time.perf_counter() - t0


async def through_worker(samplers: Any, tasks: list[Any], step: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    tokens = 0
    async for s in samplers.generate(step, tasks, 0):
        tokens += len(s.response_ids)
    return tokens, time.perf_counter() - t0


def best(runs: list[tuple[int, float]], counted: tuple[float, float] | None = None,
         calls: str = "steps") -> dict[str, float]:
    """The fastest run, the median rate, and from the engine's counters summed over all the runs
    (``counted``: pipeline.engines.engine_counters' steps and seconds inside them, when given) its
    own generate time and ``calls`` per run. Engine time close to the wall means generate itself ran
    slower (contention); far below it, the wrapper waited."""
    tps = [n / w for n, w in runs if w > 0]
    i = max(range(len(tps)), key=tps.__getitem__)
    out = {"tokens": runs[i][0], "wall_s": runs[i][1], "tokens_per_s": tps[i],
           "tokens_per_s_median": sorted(tps)[len(tps) // 2]}
    if counted is not None:
        out["wall_s_mean"] = sum(w for _, w in runs) / len(runs)
        out["engine_s_mean"] = counted[1] / len(runs)
        out[f"{calls}_per_run"] = counted[0] / len(runs)
    return out


class StepProbe:
    """vLLM only: wraps the engine's ``llm_engine.step`` to count, per path, its steps, their
    mean time and the running batch (unfinished requests when a step starts), and the steps
    taken before every request of a run had joined: what tells a slower step from a batch that
    formed late."""

    def __init__(self, engine: Any) -> None:
        self.llm_engine = engine.llm.llm_engine
        self.inner = self.llm_engine.step
        self.calls: list[tuple[float, int]] = []
        self.llm_engine.step = self._step

    def _step(self) -> Any:
        n = self.llm_engine.get_num_unfinished_requests()
        t0 = time.perf_counter()
        out = self.inner()
        self.calls.append((time.perf_counter() - t0, n))
        return out

    def take(self) -> list[tuple[float, int]]:
        calls, self.calls = self.calls, []
        return calls


class GCPauses:
    """Seconds the garbage collector ran (any thread: it stops them all) since the last ``take``."""

    def __init__(self) -> None:
        self.total, self._start = 0.0, 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start:
            self.total += time.perf_counter() - self._start

    def take(self) -> float:
        total, self.total = self.total, 0.0
        return total

    def close(self) -> None:
        gc.callbacks.remove(self._on)


def probe_summary(calls: list[tuple[float, int]], runs: int, requests: int, first: list[tuple[float, int]]) -> dict[str, float]:
    """``calls``: every step of a path's timed runs; ``first``: those of its first timed run."""
    if not calls:
        return {}
    full = [i for i, (_, n) in enumerate(first) if n >= requests]
    return {"probe_steps_per_run": len(calls) / runs,
            "probe_step_ms": 1e3 * sum(d for d, _ in calls) / len(calls),
            "probe_batch_mean": sum(n for _, n in calls) / len(calls),
            "probe_first_step_batch": first[0][1] if first else 0,
            "probe_steps_before_full_batch": full[0] if full else -1}


async def in_process(args: Any, model_cfg: Any, rollout: Any) -> list[dict[str, Any]]:
    """Every path warmed up once, then ``--repeats`` rounds of one run of each path in turn: the
    engine's speed drifts from run to run (the same batch took 14-23 k tokens/s on the H200), so
    paths timed in separate blocks would compare drifts, not paths. Each row also gets the median
    over rounds of its overhead against the reference path's run of the same round."""
    from pipeline.engines import engine_counters, make_engine
    from pipeline.models.load import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(model_cfg)
    engine = make_engine(rollout.engine, model, tokenizer)
    # as a sampler worker does (pipeline/sampler_worker.py): what exists now (torch, the engine,
    # ~400k objects) is frozen, so a full collection during a run walks only what runs allocate;
    # the collector's pauses are still counted per path (gc_ms_per_run)
    gc.collect()
    gc.freeze()
    pauses = GCPauses()
    counted_as = counter_name(args)
    env, tasks = toy_tasks(args.tasks)
    probe = StepProbe(engine) if args.engine == "vllm" else None
    n_req = args.tasks * args.trajectories

    def alone(_: int) -> Any:
        return engine_alone(engine, tokenizer, env, tasks, rollout)

    async def without_wait(_: int) -> tuple[int, float]:  # the same engine without its admission wait
        wait, engine.admit_wait_s = engine.admit_wait_s, 0.0
        try:
            return await alone(0)
        finally:
            engine.admit_wait_s = wait

    paths: list[tuple[str, Any, bool]] = []  # (row name, one run, the engine's counters apply)
    if args.engine == "vllm":
        paths += [("bare vLLM (LLM.generate)", lambda _: bare_vllm(engine, tokenizer, env, tasks, rollout), False),
                  ("engine, admit_wait_s=0", without_wait, True)]
    paths += [("engine", alone, True),
              ("rollout (in process)", lambda i: through_rollout(engine, tokenizer, env, tasks, rollout, i), True)]
    runs: dict[str, list[tuple[int, float]]] = {name: [] for name, _, _ in paths}
    busy: dict[str, list[float]] = {name: [0.0, 0.0] for name, _, _ in paths}  # engine steps, seconds
    calls: dict[str, list[tuple[float, int]]] = {name: [] for name, _, _ in paths}
    first: dict[str, list[tuple[float, int]]] = {}
    gc_s: dict[str, float] = {name: 0.0 for name, _, _ in paths}
    try:
        for name, run_once, _ in paths:  # warm-up: first batch of that size, first calls of the path
            await run_once(0)
        if probe:
            probe.take()
        for r in range(args.repeats):
            for name, run_once, counted in paths:
                before = engine_counters(engine)
                pauses.take()
                runs[name].append(await run_once(r + 1))
                gc_s[name] += pauses.take()
                after = engine_counters(engine)
                if counted:
                    busy[name] = [b + a - s for b, a, s in zip(busy[name], after, before)]
                if probe:
                    taken = probe.take()
                    calls[name] += taken
                    first.setdefault(name, taken)
        rows = []
        ref = paths[0][0]
        for name, _, counted in paths:
            row = {"path": name, **best(runs[name], tuple(busy[name]) if counted else None, counted_as)}
            if name != ref:
                row["overhead_paired_median"] = statistics.median(
                    1.0 - (n / w) / (n0 / w0) for (n, w), (n0, w0) in zip(runs[name], runs[ref]))
            if probe:
                row.update(probe_summary(calls[name], args.repeats, n_req, first.get(name, [])))
            row["gc_ms_per_run"] = 1e3 * gc_s[name] / max(1, args.repeats)
            rows.append(row)
            progress("sampler", row)
    finally:
        pauses.close()
        await engine.aclose()
        del engine, model
        gc.unfreeze()
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:
            pass
    return rows


def counter_name(args: Any) -> str:
    """What the engine's counter counts: HF its generate calls (batches), vLLM its engine steps."""
    return "batches" if args.engine == "hf" else "steps"


async def worker_counters(samplers: Any) -> tuple[float, float]:
    """pipeline.engines.engine_counters of the (one) sampler worker's engine, from its stats."""
    from pipeline.engines import counters_of

    stats = (await samplers.stats())[0]
    return counters_of({k.removeprefix("engine/"): v for k, v in stats.items() if k.startswith("engine/")})


async def in_worker(args: Any, model_cfg: Any, rollout: Any) -> dict[str, Any]:
    from pipeline.sampler import SamplerGroup

    import torch

    gpus = 1.0 if torch.cuda.is_available() else 0.0
    env_spec = {"_target_": "rewards.toy.ToyEnv", "n_tasks": args.tasks}
    samplers = SamplerGroup(model_cfg, rollout, env_spec, n_workers=1, num_cpus=1, num_gpus=gpus)
    try:
        _, tasks = toy_tasks(args.tasks)
        await through_worker(samplers, tasks, 0)  # warm-up
        before = await worker_counters(samplers)
        runs = [await through_worker(samplers, tasks, i + 1) for i in range(args.repeats)]
        after = await worker_counters(samplers)
        return {"path": "SamplerWorker (Ray actor)",
                **best(runs, (after[0] - before[0], after[1] - before[1]), counter_name(args))}
    finally:
        samplers.shutdown()


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--trajectories", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-inflight", type=int, default=256)
    p.add_argument("--stream-buffer", type=int, default=256)
    p.add_argument("--hf-batch", type=int, default=32)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--skip-worker", action="store_true", help="no SamplerWorker (Ray actor) row")
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="torch threads on CPU, in process and in the actor alike (a fair comparison)")
    args = p.parse_args()
    # before torch starts its pools: OpenMP reads these once, and the engine computes in its own thread
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.cpu_threads)

    import ray
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(args.cpu_threads)

    model_cfg, rollout = configs(args)
    rows = asyncio.run(in_process(args, model_cfg, rollout))
    threads = str(args.cpu_threads)
    if args.skip_worker:  # the in-process rows only (a device call with little time: no Ray, no second engine)
        return finish(args, rows)
    ray.init(num_cpus=4, num_gpus=1 if torch.cuda.is_available() else 0, include_dashboard=False,
             log_to_driver=True, runtime_env={"env_vars": {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                                                           "TOKENIZERS_PARALLELISM": "false"}})
    try:
        rows.append(asyncio.run(in_worker(args, model_cfg, rollout)))
        progress("sampler", rows[-1])
    finally:
        ray.shutdown()
    finish(args, rows)


def finish(args: Any, rows: list[dict[str, Any]]) -> None:
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["overhead"] = 1.0 - r["tokens_per_s"] / base
        if "engine_s_mean" in r and r["wall_s_mean"]:  # the time outside generate: the wrapper's cost
            r["outside_engine_share"] = 1.0 - r["engine_s_mean"] / r["wall_s_mean"]
    # that row is a diagnosis; the paired median (same round against the reference) where measured
    worst = max(r.get("overhead_paired_median", r["overhead"]) for r in rows[1:] if "admit_wait_s=0" not in r["path"])
    extra = {"engine": args.engine, "preset": args.preset,
             "requests": args.tasks * args.trajectories, "max_tokens": args.max_tokens,
             "target_overhead_le_5pct": target(worst <= 0.05)}
    if all("outside_engine_share" in r for r in rows):
        # the tokens/s ratio carries the engine's own run-to-run variance (on the H200 the same
        # HF batch took 1.8-6.6 s); the share of wall time spent outside generate does not
        extra["target_outside_engine_le_5pct"] = target(max(r["outside_engine_share"] for r in rows) <= 0.05)
    report("sampler", args, rows, extra)


if __name__ == "__main__":
    main()
