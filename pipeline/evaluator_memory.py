"""Kernel evaluations on the sampler's own GPU (``resources.evaluator.gpus=0``): the memory they may
reserve beside the engine and a colocated trainer, and the tasks whose evaluations fit it.

The sandbox's admission counts its own steps' footprints against ``sandbox.gpu_memory_share`` and
knows nothing of the pools' processes; this module lowers that share to what the pools leave, and
checks before the model loads that one evaluation of each of the run's tasks fits it. Without the
check a task whose evaluation needs more than the share is admitted alone and runs over it: on one
H100 80GB (2026-12-07) a KernelBench level-1 elementwise task at its published size (inputs of
1.6e9 floats) held ~40 GB in its judge and runners beside a vLLM engine at 0.25 and a trainer at
0.4, and the trainer's next step ran out of memory.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config import Config
    from pipeline.resources_config import ResourcesConfig

# a CUDA context and allocator slack of each process on the GPU that the pools' fractions do not
# count (measured: 0.5-0.6 GiB a context on an H100; 0.03 of 80 GB is 2.4 GB for the engine's and
# the trainer's processes and what vLLM's profiling leaves)
_CONTEXT_MARGIN = 0.03


def evaluations_on_sampler_gpu(cfg: ResourcesConfig) -> bool:
    """Kernel evaluations run on a sampler worker's own GPU: no evaluator GPUs, GPU samplers."""
    return cfg.evaluator.gpus == 0 and cfg.sampler.gpus > 0


def evaluator_memory_share(cfg: ResourcesConfig, colocated: bool, engine: str,
                           engine_fraction: float, sandbox_share: float) -> tuple[float, str] | None:
    """The share of its GPU's memory kernel evaluations may reserve where they run on the sampler
    worker's own GPU (``resources.evaluator.gpus=0``): what the engine, and a trainer colocated
    with it, leave of it, less a margin for their contexts; with the reason, for the log. None
    where nothing needs to change (evaluation GPUs of their own, CPU samplers, an HF engine alone
    on its GPU: it takes memory as it goes, so no share is fixed for it, or a share already
    small enough). ``engine_fraction``: vLLM's ``gpu_memory_utilization`` where the GPU is not
    shared (the pool's fraction replaces it where it is)."""
    s, t = cfg.sampler, cfg.trainer
    if not evaluations_on_sampler_gpu(cfg):
        return None
    if colocated:
        taken = s.gpu_memory_fraction + t.gpu_memory_fraction
        why = (f"resources.sampler.gpu_memory_fraction={s.gpu_memory_fraction} + "
               f"resources.trainer.gpu_memory_fraction={t.gpu_memory_fraction}")
    elif engine == "vllm":
        taken, why = engine_fraction, f"rollout.engine.vllm.gpu_memory_utilization={engine_fraction}"
    else:
        return None
    share = round(max(0.0, 1.0 - taken - _CONTEXT_MARGIN), 4)
    return (share, why) if share < sandbox_share else None


def leave_room_for_pools(cfg: Config, colocated: bool) -> None:
    """Kernel evaluations on the sampler's own GPU reserve only what the engine and a colocated
    trainer leave of it (``sandbox.gpu_memory_share`` of the job's config lowered to that, and said
    so; ``colocated``: the trainer shares the sampler's GPU): the sandbox's
    admission counts its own steps' footprints against that share and knows nothing of the pools'
    processes, so with its default 0.9 beside a vLLM engine at 0.45 and a trainer at 0.45
    evaluations would run the GPU out of memory. There every timed step also times the reference
    (``sandbox.reference_per_step``)."""
    from pipeline.config import ConfigError  # pipeline.config imports this module

    if cfg.env != "kernel" or cfg.reward.backend not in ("cuda", "triton"):
        return
    if evaluations_on_sampler_gpu(cfg.resources) and not cfg.sandbox.reference_per_step:
        # a reference timed once (cached) and an answer timed while the engine or the trainer runs
        # beside it are not a ratio: the same stored answers scored 1.0-1.2x in sync mode and 0.15x
        # in one_off's steps that overlapped training (H100, 2026-12-06, reference cached)
        print("[pipeline] kernel evaluations share the sampler's GPU: sandbox.reference_per_step -> true "
              "(each answer's ratio to a reference timed under the same load)", file=sys.stderr, flush=True)
        cfg.sandbox.reference_per_step = True
    engine = cfg.rollout.engine
    # only the selected engine's keys are read: under rollout=hf, rollout.engine.vllm is unset
    fraction = float(engine.vllm.gpu_memory_utilization) if engine.type == "vllm" else 0.0
    got = evaluator_memory_share(cfg.resources, colocated, engine.type, fraction,
                                 cfg.sandbox.gpu_memory_share)
    if got is not None:
        share, why = got
        if share < 0.02:
            raise ConfigError(
                f"kernel evaluations run on the sampler's GPU (resources.evaluator.gpus=0), and {why} "
                f"leave {share:.2f} of it: lower them, or give evaluations GPUs of their own "
                "(resources.evaluator.gpus)")
        print(f"[pipeline] kernel evaluations share the sampler's GPU: sandbox.gpu_memory_share "
              f"{cfg.sandbox.gpu_memory_share} -> {share} (what {why} leave)", file=sys.stderr, flush=True)
        cfg.sandbox.gpu_memory_share = share
    if evaluations_on_sampler_gpu(cfg.resources):
        fit_tasks_to_share(cfg)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def fit_tasks_to_share(cfg: Config) -> None:
    """Every task of the run must have evaluations that fit ``sandbox.gpu_memory_share`` of the GPU
    they share with the pools (the sandbox's admission estimate of one evaluation, from the task's
    meta-device footprint: ``rewards.interface.evaluation_memory``). A task whose evaluation may hold
    more is named with its bytes in a ConfigError that says the ways out; with
    ``reward.skip_invalid_tasks`` it is left out of the run instead (``reward.task_ids`` set to the
    others) and said so. Nothing is checked where no GPU is visible to this process."""
    from pipeline.config import ConfigError  # pipeline.config imports this module
    from rewards.interface import evaluation_memory, split_tasks

    memory, need = evaluation_memory(cfg.reward, cfg.sandbox)
    if not memory:
        return
    budget = int(memory * cfg.sandbox.gpu_memory_share)
    over = sorted(((b, t) for t, b in need.items() if b is not None and b > budget), reverse=True)
    if not over:
        return
    listed = ", ".join(f"{t} {_gib(b)}" for b, t in over[:6]) + (f" and {len(over) - 6} more" if len(over) > 6 else "")
    room = (f"sandbox.gpu_memory_share={cfg.sandbox.gpu_memory_share} of the sampler's {_gib(memory)} GPU: "
            f"{_gib(budget)}")
    if not cfg.reward.skip_invalid_tasks:
        raise ConfigError(
            f"one kernel evaluation of {len(over)} of the run's {len(need)} tasks may hold more GPU memory "
            f"than evaluations may reserve beside the engine and the trainer ({room}): {listed}. Choose "
            "tasks that fit (reward.task_ids), leave these out (reward.skip_invalid_tasks=true), lower "
            "resources.sampler.gpu_memory_fraction / resources.trainer.gpu_memory_fraction, or give "
            "evaluations GPUs of their own (resources.evaluator.gpus)")
    dropped = {t for _, t in over}
    kept = [t for t in need if t not in dropped]
    if kept:  # (an empty reward.task_ids means every task)
        cfg.reward.task_ids = kept
    if not kept or not split_tasks(cfg.env, cfg.reward, cfg.toy, "train"):
        raise ConfigError(f"no train task's evaluation fits what evaluations may reserve beside the engine "
                          f"and the trainer ({room}): {listed}")
    print(f"[pipeline] reward.skip_invalid_tasks: {len(over)} task(s) left out, one evaluation may hold more "
          f"than {room}: {listed}", file=sys.stderr, flush=True)
