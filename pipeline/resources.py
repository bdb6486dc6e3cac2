"""Static split of the Ray cluster into resource pools (verl's word): a sampler pool, a trainer pool
and, optionally, a dedicated evaluation pool.

Each resource pool is one Ray placement group of identical bundles: one bundle per sampler worker
(its GPUs for a tensor-parallel engine, or none on CPU) and one bundle per trainer rank (one GPU,
or none for a CPU rank). Any N:M split works, on one node or many (``strategy``). On a machine
with fewer GPUs than the two pools ask for together, both pools may share the same GPUs
(``colocate``): each bundle then takes a fraction of a GPU and the engine/trainer cap their
memory to it.

``plan_resources`` is pure (cluster resources in, bundle lists out) so the placement arithmetic is
testable without Ray; ``create_resource_pools`` reserves the groups and waits for them.

The kernel evaluator (sandbox) runs inside each sampler worker. With ``resources.evaluator.gpus
= 0`` it times kernels on the GPUs that worker sees (the engine's); with N > 0 a third placement
group reserves N whole GPUs that no engine or trainer rank gets, and each sampler worker's
evaluator is given the pool's GPUs on its own node (:func:`assign_evaluator_gpus`).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.resources_config import ResourcesConfig

if TYPE_CHECKING:
    from pipeline.config import Config


STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
COLOCATE = ("auto", "always", "never")


class ResourcesDoNotFit(ValueError):
    """The requested split does not fit the cluster; the message names the config keys."""


@dataclass
class ResourcePlan:
    """Bundles for each pool. ``colocated``: both pools share the same GPUs."""

    sampler_bundles: list[dict[str, float]]
    trainer_bundles: list[dict[str, float]]
    colocated: bool
    sampler_gpus_per_worker: float
    trainer_gpu_per_rank: float
    evaluator_bundles: list[dict[str, float]] = field(default_factory=list)

    @property
    def n_samplers(self) -> int:
        return len(self.sampler_bundles)

    @property
    def world_size(self) -> int:
        return len(self.trainer_bundles)


def plan_resources(cfg: ResourcesConfig, cluster: dict[str, float]) -> ResourcePlan:
    """Bundles per pool for ``cfg`` on a cluster with ``cluster`` resources (ray.cluster_resources())."""
    s, t = cfg.sampler, cfg.trainer
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"resources.strategy={cfg.strategy!r}: expected one of {STRATEGIES}")
    if cfg.colocate not in COLOCATE:
        raise ValueError(f"resources.colocate={cfg.colocate!r}: expected one of {COLOCATE}")
    e = cfg.evaluator
    for key, val in (("resources.sampler.gpus", s.gpus), ("resources.trainer.gpus", t.gpus),
                     ("resources.evaluator.gpus", e.gpus)):
        if val < 0:
            raise ValueError(f"{key}={val}: expected >= 0")
    if s.gpus > 0 and (s.gpus_per_worker < 1 or s.gpus % s.gpus_per_worker):
        raise ValueError(
            f"resources.sampler.gpus={s.gpus} must be a positive multiple of "
            f"resources.sampler.gpus_per_worker={s.gpus_per_worker}")
    if s.gpus == 0 and s.cpu_workers < 1:
        raise ValueError(f"resources.sampler.cpu_workers={s.cpu_workers}: expected >= 1 when "
                         "resources.sampler.gpus=0")
    if t.gpus == 0 and t.cpu_ranks < 1:
        raise ValueError(f"resources.trainer.cpu_ranks={t.cpu_ranks}: expected >= 1 when "
                         "resources.trainer.gpus=0")

    have_gpus = float(cluster.get("GPU", 0.0))
    have_cpus = float(cluster.get("CPU", 0.0))
    if e.gpus > have_gpus + 1e-9:
        raise ResourcesDoNotFit(f"resources.evaluator.gpus={e.gpus} GPUs requested, but the Ray cluster "
                            f"has {have_gpus:g}")
    # evaluation GPUs are whole and never shared: the two other pools split what is left
    have_gpus -= e.gpus
    want_gpus = s.gpus + t.gpus
    colocated = False
    if want_gpus > have_gpus + 1e-9:
        # auto shares only when both pools ask for exactly the GPUs there are (e.g. one GPU);
        # "always" also shares a subset. Anything else is a mistake worth stopping for.
        shareable = s.gpus > 0 and t.gpus > 0 and max(s.gpus, t.gpus) <= have_gpus
        exact = s.gpus == t.gpus == int(have_gpus)
        if shareable and (cfg.colocate == "always" or (cfg.colocate == "auto" and exact)):
            colocated = True
        else:
            hint = (f" (resources.colocate={cfg.colocate} shares GPUs only when "
                    "sampler.gpus = trainer.gpus = the cluster's GPUs; 'always' shares a subset)"
                    if cfg.colocate == "auto" and shareable else
                    " (resources.colocate=never forbids sharing GPUs between the pools)"
                    if cfg.colocate == "never" and shareable else "")
            held = f" after resources.evaluator.gpus={e.gpus}" if e.gpus else ""
            raise ResourcesDoNotFit(
                f"resources.sampler.gpus={s.gpus} + resources.trainer.gpus={t.gpus} = {want_gpus} "
                f"GPUs requested, but the Ray cluster has {have_gpus:g}{held}{hint}. Lower them, or "
                "give resources.ray.address of a larger cluster.")
    elif cfg.colocate == "always" and s.gpus > 0 and t.gpus > 0:
        colocated = True

    if colocated:
        fs, ft = s.gpu_memory_fraction, t.gpu_memory_fraction
        if fs <= 0 or ft <= 0 or fs + ft > 1.0 + 1e-9:
            raise ResourcesDoNotFit(
                f"the pools share GPUs, so resources.sampler.gpu_memory_fraction={fs} + "
                f"resources.trainer.gpu_memory_fraction={ft} must be in (0, 1]")
        # Ray accepts fractional GPUs only below 1 per bundle: a tensor-parallel engine on shared
        # GPUs would need several fractional bundles; one GPU per sampler worker is what fits.
        if s.gpus_per_worker != 1:
            raise ResourcesDoNotFit(
                f"shared GPUs need resources.sampler.gpus_per_worker=1 (got {s.gpus_per_worker})")
        sampler_bundle = {"GPU": fs, "CPU": s.cpus_per_worker}
        trainer_bundle = {"GPU": ft, "CPU": t.cpus_per_rank}
        n_samplers, ranks = s.gpus, t.gpus
        s_gpw, t_gpr = fs, ft
    else:
        if s.gpus > 0:
            n_samplers = s.gpus // s.gpus_per_worker
            sampler_bundle = {"GPU": float(s.gpus_per_worker), "CPU": s.cpus_per_worker}
            s_gpw = float(s.gpus_per_worker)
        else:
            n_samplers, sampler_bundle, s_gpw = s.cpu_workers, {"CPU": s.cpus_per_worker}, 0.0
        if t.gpus > 0:
            ranks, trainer_bundle, t_gpr = t.gpus, {"GPU": 1.0, "CPU": t.cpus_per_rank}, 1.0
        else:
            ranks, trainer_bundle, t_gpr = t.cpu_ranks, {"CPU": t.cpus_per_rank}, 0.0

    eval_bundles = [{"GPU": 1.0, "CPU": float(e.cpus_per_gpu)} for _ in range(e.gpus)]
    want_cpus = (n_samplers * sampler_bundle["CPU"] + ranks * trainer_bundle["CPU"]
                 + sum(b["CPU"] for b in eval_bundles))
    if want_cpus > have_cpus + 1e-9:
        extra = (f" + {e.gpus} evaluator GPUs x resources.evaluator.cpus_per_gpu={e.cpus_per_gpu}"
                 if e.gpus else "")
        raise ResourcesDoNotFit(
            f"{n_samplers} sampler workers x resources.sampler.cpus_per_worker="
            f"{s.cpus_per_worker} + {ranks} trainer ranks x resources.trainer.cpus_per_rank="
            f"{t.cpus_per_rank}{extra} = {want_cpus:g} CPUs requested, but the Ray cluster has "
            f"{have_cpus:g} (resources.ray.cpu_oversubscribe raises a local cluster's count)")
    return ResourcePlan(
        sampler_bundles=[dict(sampler_bundle) for _ in range(n_samplers)],
        trainer_bundles=[dict(trainer_bundle) for _ in range(ranks)],
        colocated=colocated, sampler_gpus_per_worker=s_gpw, trainer_gpu_per_rank=t_gpr,
        evaluator_bundles=eval_bundles)


@dataclass
class ResourcePool:
    """One reserved placement group; ``actor_options(i)`` places an actor on bundle i."""

    name: str
    bundles: list[dict[str, float]]
    placement_group: Any

    def __len__(self) -> int:
        return len(self.bundles)

    def actor_options(self, i: int) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        b = self.bundles[i]
        return dict(
            num_cpus=b.get("CPU", 0.0), num_gpus=b.get("GPU", 0.0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=i,
                placement_group_capture_child_tasks=True))


@dataclass
class ResourcePools:
    plan: ResourcePlan
    sampler: ResourcePool
    trainer: ResourcePool
    evaluator: ResourcePool | None = None

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pool in (self.sampler, self.trainer, self.evaluator):
            if pool is None:
                continue
            try:
                remove_placement_group(pool.placement_group)
            except Exception:  # already gone with the cluster
                pass


def create_resource_pools(cfg: ResourcesConfig) -> ResourcePools:
    """Reserve both pools on the running Ray cluster, or fail naming the keys."""
    import ray
    from ray.util.placement_group import placement_group

    import uuid

    plan = plan_resources(cfg, ray.cluster_resources())
    groups = {}
    tag = uuid.uuid4().hex[:8]  # group names are cluster-wide: several jobs may share a cluster
    named = [("sampler", plan.sampler_bundles), ("trainer", plan.trainer_bundles)]
    if plan.evaluator_bundles:
        named.append(("evaluator", plan.evaluator_bundles))
    for name, bundles in named:
        pg = placement_group(bundles, strategy=cfg.strategy, name=f"{name}_pool_{tag}")
        groups[name] = ResourcePool(name, bundles, pg)
    for pool in groups.values():
        ready, _ = ray.wait([pool.placement_group.ready()], timeout=cfg.placement_timeout_s)
        if not ready:
            raise ResourcesDoNotFit(
                f"the {pool.name} pool ({len(pool.bundles)} x {pool.bundles[0]}) was not placed "
                f"within resources.placement_timeout_s={cfg.placement_timeout_s}: the cluster's "
                f"free resources are {ray.available_resources()}; with resources.strategy="
                f"{cfg.strategy} the bundles may not fit per node")
    return ResourcePools(plan, groups["sampler"], groups["trainer"], groups.get("evaluator"))


def bundle_nodes(pool: ResourcePool) -> list[str]:
    """The node id each bundle of a reserved pool was placed on."""
    from ray.util.placement_group import placement_group_table

    table = placement_group_table(pool.placement_group)["bundles_to_node_id"]
    return [table[i] for i in range(len(pool.bundles))]


def evaluator_gpu_ids(pool: ResourcePool) -> list[tuple[str, int]]:
    """(node id, GPU index) of each evaluation bundle, as Ray assigned them (a task per bundle
    asks; it ends at once, the bundle stays reserved so nothing else is placed there)."""
    import ray

    @ray.remote(num_gpus=1, num_cpus=0)
    def where() -> tuple[str, list[Any]]:
        return ray.get_runtime_context().get_node_id(), list(ray.get_gpu_ids())

    refs = [where.options(**{**pool.actor_options(i), "num_gpus": 1, "num_cpus": 0}).remote()
            for i in range(len(pool))]
    out = []
    for node, ids in ray.get(refs):
        out += [(node, int(g)) for g in ids]
    return out


def assign_evaluator_gpus(sampler_nodes: list[str], eval_gpus: list[tuple[str, int]]) -> list[list[int]]:
    """GPU ids for each sampler worker's evaluator: the evaluation GPUs of its node, split into
    disjoint shares when the node has at least as many as workers (else shared round-robin)."""
    by_node: dict[str, list[int]] = {}
    for node, gpu in eval_gpus:
        by_node.setdefault(node, []).append(gpu)
    workers_on: dict[str, list[int]] = {}
    for i, node in enumerate(sampler_nodes):
        workers_on.setdefault(node, []).append(i)
    out: list[list[int]] = [[] for _ in sampler_nodes]
    for node, workers in workers_on.items():
        gpus = sorted(by_node.get(node, []))
        if not gpus:
            raise ResourcesDoNotFit(
                f"resources.evaluator.gpus: no evaluation GPU was placed on the node of sampler "
                f"worker(s) {workers}; their evaluator runs in the worker, so each sampler node "
                f"needs its own (raise resources.evaluator.gpus, or resources.strategy=STRICT_PACK "
                f"on one node)")
        for k, w in enumerate(workers):
            out[w] = (gpus[k::len(workers)] if len(gpus) >= len(workers) else [gpus[k % len(gpus)]])
    return out


def check_builds(resources: ResourcesConfig) -> None:
    """``resources.builds``' counts (pipeline.config.check runs it before Ray starts)."""
    b = resources.builds
    if b.workers < 0 or b.cpus_per_build < 0:
        raise ValueError(f"resources.builds.workers={b.workers}, resources.builds.cpus_per_build="
                         f"{b.cpus_per_build}: expected counts >= 0")


def route_builds(cfg: Config, n_samplers: int) -> None:
    """``resources.builds.workers`` > 0: every sampler worker's kernel evaluator sends its compile
    steps to Ray build actors (``sandbox.build_pool=ray``), its share of them each (rounded up),
    ``cpus_per_build`` Ray CPUs and ``node_resource`` each; said so. The actors take CPUs no
    placement group holds; ones Ray cannot place are dropped after two minutes and their builds
    run on the sampler's host (sandbox/build_pool.py). The counts were checked before Ray started
    (:func:`check_builds`)."""
    b = cfg.resources.builds
    if b.workers == 0 or cfg.env != "kernel":
        return
    each = max(1, math.ceil(b.workers / max(1, n_samplers)))
    s = cfg.sandbox
    s.build_pool, s.ray_build_workers, s.ray_build_cpus, s.ray_build_resource = "ray", each, b.cpus_per_build, \
        b.node_resource
    print(f"[pipeline] kernel builds run on Ray build actors: {each} for each of the {n_samplers} sampler "
          f"worker(s), {b.cpus_per_build:g} CPU each"
          + (f", on nodes offering {b.node_resource!r}" if b.node_resource else ""), file=sys.stderr, flush=True)


def init_ray(cfg: ResourcesConfig, runtime_env: dict[str, Any] | None = None) -> bool:
    """Start (or join) Ray as the config says; a local cluster may oversubscribe CPUs.
    Returns False when Ray was already initialised in this process (the caller then leaves it
    running: it is not theirs to shut down)."""
    import os

    import ray

    if ray.is_initialized():
        return False
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, runtime_env=runtime_env, log_to_driver=True)
        return True
    cpus = cfg.ray.num_cpus
    if cpus is None:
        cpus = max(1, math.ceil((os.cpu_count() or 1) * cfg.ray.cpu_oversubscribe))
    kw: dict[str, Any] = dict(num_cpus=cpus, include_dashboard=False, runtime_env=runtime_env)
    if cfg.ray.num_gpus is not None:
        kw["num_gpus"] = cfg.ray.num_gpus
    ray.init(**kw)
    return True
