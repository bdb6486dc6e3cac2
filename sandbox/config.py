"""Schema of the sandbox configuration. Types only: every value lives in conf/sandbox/default.yaml."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

BACKENDS = ("cpu", "triton", "cuda")
BUILD_POOLS = ("local", "ray")
from pipeline.conf_files import CONF_DIR as _CONF  # noqa: E402  (conf/ in a checkout, pipeline/conf installed)

DEFAULT_YAML = _CONF / "sandbox" / "default.yaml"


@dataclass
class Tolerance:
    atol: float = MISSING
    rtol: float = MISSING


@dataclass
class SandboxConfig:
    backend: str = MISSING                 # cpu | triton | cuda: used when a call names none
    correctness_trials: int = MISSING      # fresh random inputs and seed per trial
    seed: int = MISSING                    # base seed; trial i uses seed + i
    warmup_runs: int = MISSING
    timing_runs: int = MISSING             # the reported runtime is their median
    # an answer whose first timed call shows its warmup + timing runs would hold the device alone
    # longer than this makes fewer calls (one warmup, at least 3 timed): 0 turns it off
    timing_budget_s: float = MISSING
    timing_input_sets: int = MISSING       # timing rotates over this many input buffers (values fresh every call)
    checked_share: float = MISSING         # share of timed calls whose output the judge checks (>= 1 per input set)
    # keyed by torch dtype name without the "torch." prefix (float32, float16, bfloat16, ...)
    tolerance: dict[str, Tolerance] = field(default_factory=dict)
    compile_timeout_s: float = MISSING
    run_timeout_s: float = MISSING         # wall limit of the run step (correctness + timing)
    call_timeout_floor_s: float = MISSING  # one call of the answer, once the task's reference time is known:
    call_timeout_ref_factor: float = MISSING  # at most max(floor, factor x the reference's time)
    memory_limit_bytes: int = MISSING      # host memory of one evaluation (RLIMIT_AS or RSS watch)
    max_open_files: int = MISSING
    max_processes: int = MISSING           # RLIMIT_NPROC; only where the kernel enforces it
    cpu_time_limit_s: int = MISSING        # RLIMIT_CPU of one worker process
    max_file_size_bytes: int = MISSING     # RLIMIT_FSIZE: a build's largest file must fit
    max_build_dir_bytes: int = MISSING     # quota of one answer's build dir (checked after its compile step)
    max_build_dir_files: int = MISSING
    shm_bytes: int = MISSING               # size of each step's private /dev/shm (a tmpfs in its mount namespace)
    max_concurrent: int = MISSING          # evaluations in flight in one pool
    compile_workers: int = MISSING         # compile steps in flight in one pool
    build_pool: str = MISSING              # local | ray: where compile steps run (sandbox/build_pool.py)
    ray_build_workers: int = MISSING       # ray: build actors (one compile step each at a time) over the cluster's nodes
    ray_build_cpus: float = MISSING        # ray: Ray CPUs each build actor reserves
    ray_build_resource: str | None = MISSING  # ray: a custom resource a node must offer to take builds (null: any node)
    ray_build_node_dir: str | None = MISSING  # ray: a node's own build files ("{node}": its id), bound at cache_dir
    cache_dir: str | None = MISSING        # null: a directory under the system temp dir
    excessive_speedup_threshold: float = MISSING  # speedups above this get the flag excessive_speedup
    reference_per_step: bool = MISSING     # time the reference in every timed step, not once per task (a GPU shared with other work)
    reference_samples: int = MISSING       # steps of a task (in one pool) that time its reference before later ones use the fastest
    gpu_ids: list[int] = field(default_factory=list)  # empty: every visible GPU
    cpu_run_slots: int | None = MISSING    # cpu backend: run steps sharing the host for correctness (null: no gate)
    gpu_memory_share: float = MISSING      # share of a GPU's memory run steps may reserve at once (0: one step at a time)
    gpu_context_bytes: int = MISSING       # device memory of one process's CUDA context (footprints add three)
    gpu_warm_steps: int = MISSING          # the first N steps waiting for a GPU start CUDA before admission (room kept out of the budget)
    gpu_max_steps: int = MISSING           # run steps holding one GPU at once, whatever their footprints (0: as many as fit)
    admission_overtake_s: float = MISSING  # a step that fits may pass earlier ones that do not while they waited less (0: strict order)
    block_network: bool = MISSING          # own network namespace where the OS allows it
    restrict_writes: bool = MISSING        # Landlock: writes only to the evaluation's own dirs
    pid_namespace: bool = MISSING          # own PID namespace: every leftover process dies with it
    gpu_isolation_probe: bool = MISSING    # before the first GPU run step, find the isolation the device survives
    cpu_threads: int = MISSING             # torch / OpenMP threads of one evaluation
    gpu_flush_bytes: int = MISSING         # buffer written between timed runs to flush the L2
    cpu_flush_bytes: int = MISSING         # same on CPU, for the last-level cache
    max_jobs: int = MISSING                # ninja jobs of one build (MAX_JOBS)
    cuda_arch: str | None = MISSING        # TORCH_CUDA_ARCH_LIST; null: the arch of the assigned GPU
    precompiled_header: bool = MISSING     # build torch/extension.h once per flag set and reuse it
    narrow_cuda_header: bool = MISSING     # nvcc sees torch/types.h for torch/extension.h first (build.py)
    split_build: bool = MISSING            # cpu backend: the answer's C++ alone + trusted binders (split_build.py)
    split_build_cuda: bool = MISSING       # with split_build, cuda backend too: nvcc sees no torch header (split_cuda.py)
    pch_min_builds: int = MISSING          # a flag set gets a PCH once this many builds used it
    pch_max_sets: int = MISSING            # at most this many PCHs (~755 MB each) per cache
    poison_bytes: int = MISSING            # NaN-filled memory freed before every candidate run
    output_tail_bytes: int = MISSING       # how much of a worker's stdout/stderr is kept
    lost_worker_retries: int = MISSING     # a worker that vanished without a verdict is rerun this often
    keep_workdirs: bool = MISSING          # keep per-evaluation dirs (debugging)
    zygote_worker: bool = MISSING          # host run steps fork from a pre-imported worker (sandbox/zygote.py), not a new python
    timing_probe: bool = MISSING           # time extra windows (order and settle effects) into wall_s; benches only
    zygote_gpu_steps: bool = MISSING       # GPU run steps fork from it too (each child starts its own CUDA)


def load_default_config(path: str | Path | None = None, **overrides: Any) -> SandboxConfig:
    """The YAML defaults merged onto the schema, then ``overrides``; a wrong key fails naming it."""
    schema = OmegaConf.structured(SandboxConfig)
    merged = OmegaConf.merge(schema, OmegaConf.load(str(path or DEFAULT_YAML)), OmegaConf.create(overrides))
    cfg: SandboxConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    validate(cfg)
    return cfg


def validate(cfg: SandboxConfig) -> None:
    if cfg.backend not in BACKENDS:
        raise ValueError(f"sandbox.backend={cfg.backend!r}: expected one of {BACKENDS}")
    for name in ("correctness_trials", "timing_runs", "max_concurrent", "compile_workers", "cpu_threads",
                 "reference_samples"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"sandbox.{name}={getattr(cfg, name)}: expected an integer >= 1")
    if cfg.build_pool not in BUILD_POOLS:
        raise ValueError(f"sandbox.build_pool={cfg.build_pool!r}: expected one of {BUILD_POOLS}")
    if cfg.ray_build_workers < 1 or cfg.ray_build_cpus < 0:
        raise ValueError(f"sandbox.ray_build_workers={cfg.ray_build_workers}, sandbox.ray_build_cpus="
                         f"{cfg.ray_build_cpus}: expected an integer >= 1 and CPUs >= 0")
    if cfg.cpu_run_slots is not None and cfg.cpu_run_slots < 1:
        raise ValueError(f"sandbox.cpu_run_slots={cfg.cpu_run_slots}: expected null or an integer >= 1")
    if cfg.gpu_warm_steps < 0:
        raise ValueError(f"sandbox.gpu_warm_steps={cfg.gpu_warm_steps}: expected an integer >= 0")
    if cfg.gpu_max_steps < 0:
        raise ValueError(f"sandbox.gpu_max_steps={cfg.gpu_max_steps}: expected a count >= 0 (0: no cap)")
    if cfg.timing_budget_s < 0:
        raise ValueError(f"sandbox.timing_budget_s={cfg.timing_budget_s}: expected seconds >= 0 (0: off)")
    if cfg.admission_overtake_s < 0:
        raise ValueError(f"sandbox.admission_overtake_s={cfg.admission_overtake_s}: expected seconds >= 0")
    if not 0.0 <= cfg.gpu_memory_share <= 1.0:
        raise ValueError(f"sandbox.gpu_memory_share={cfg.gpu_memory_share}: expected a share in [0, 1]")
    for dtype in ("float32", "float16", "bfloat16"):
        if dtype not in cfg.tolerance:
            raise ValueError(f"sandbox.tolerance has no entry for {dtype!r} (has {sorted(cfg.tolerance)})")
