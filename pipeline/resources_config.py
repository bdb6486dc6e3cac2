"""Schema of the resource pools (values in conf/resources/*.yaml); pipeline/resources.py plans
and reserves them."""
from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class SamplerResources:
    gpus: int = MISSING              # sampler GPUs in total (0: CPU workers)
    gpus_per_worker: int = MISSING   # tensor-parallel size of one engine
    cpu_workers: int = MISSING       # number of workers when gpus == 0
    cpus_per_worker: float = MISSING
    gpu_memory_fraction: float = MISSING  # share of each GPU the engine may use when colocated


@dataclass
class TrainerResources:
    gpus: int = MISSING              # trainer ranks on GPUs (0: CPU ranks)
    cpu_ranks: int = MISSING         # data-parallel ranks when gpus == 0
    cpus_per_rank: float = MISSING
    gpu_memory_fraction: float = MISSING  # share of each GPU the trainer may use when colocated


@dataclass
class EvaluatorResources:
    gpus: int = MISSING              # dedicated evaluation GPUs (0: the sampler workers' own GPUs)
    cpus_per_gpu: float = MISSING    # CPUs reserved with each of them (compiles run on the host)


@dataclass
class BuildResources:
    workers: int = MISSING           # kernel builds on Ray build actors in total (0: on each sampler worker's host)
    cpus_per_build: float = MISSING  # Ray CPUs each build actor reserves
    node_resource: str | None = MISSING  # a custom resource the build nodes offer (null: any node with free CPUs)


@dataclass
class RayInit:
    address: str | None = MISSING    # null: start a local cluster; "auto" or host:port: join one
    num_cpus: int | None = MISSING   # local cluster only; null: what the machine has
    num_gpus: int | None = MISSING   # local cluster only; null: what the machine has
    # local cluster only: logical CPUs may exceed physical ones (the workers mostly wait)
    cpu_oversubscribe: float = MISSING


@dataclass
class ResourcesConfig:
    sampler: SamplerResources = field(default_factory=SamplerResources)
    trainer: TrainerResources = field(default_factory=TrainerResources)
    evaluator: EvaluatorResources = field(default_factory=EvaluatorResources)
    builds: BuildResources = field(default_factory=BuildResources)
    ray: RayInit = field(default_factory=RayInit)
    strategy: str = MISSING          # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD (Ray placement)
    colocate: str = MISSING          # auto | always | never: share GPUs between the pools
    placement_timeout_s: float = MISSING
