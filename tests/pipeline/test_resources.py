"""Placement arithmetic (pure) and real placement groups on a local Ray with logical GPUs."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.resources import ResourcesDoNotFit, create_resource_pools, plan_resources
from pipeline.resources_config import ResourcesConfig

CONF = Path(__file__).resolve().parents[2] / "conf" / "resources"


def resources(**overrides) -> ResourcesConfig:
    cfg = OmegaConf.merge(OmegaConf.structured(ResourcesConfig), OmegaConf.load(CONF / "default.yaml"))
    for k, v in overrides.items():
        OmegaConf.update(cfg, k, v)
    return OmegaConf.to_object(cfg)


def test_cpu_only_default_plan():
    plan = plan_resources(resources(), {"CPU": 8})
    assert plan.n_samplers == 1 and plan.world_size == 1 and not plan.colocated
    assert plan.sampler_bundles == [{"CPU": 1}] and plan.trainer_bundles == [{"CPU": 1}]


def test_n_to_m_split_on_gpus():
    plan = plan_resources(resources(**{"sampler.gpus": 6, "sampler.gpus_per_worker": 2,
                                   "trainer.gpus": 10}), {"CPU": 64, "GPU": 16})
    assert plan.n_samplers == 3 and plan.sampler_bundles[0]["GPU"] == 2
    assert plan.world_size == 10 and all(b["GPU"] == 1 for b in plan.trainer_bundles)
    assert not plan.colocated


def test_one_gpu_is_shared_with_memory_fractions():
    plan = plan_resources(resources(**{"sampler.gpus": 1, "trainer.gpus": 1}), {"CPU": 4, "GPU": 1})
    assert plan.colocated
    assert plan.sampler_bundles[0]["GPU"] + plan.trainer_bundles[0]["GPU"] <= 1.0


@pytest.mark.parametrize("overrides,cluster,names", [
    ({"sampler.gpus": 4, "trainer.gpus": 8}, {"CPU": 64, "GPU": 8},
     ["resources.sampler.gpus=4", "resources.trainer.gpus=8", "has 8"]),
    ({"sampler.gpus": 1, "trainer.gpus": 1, "colocate": "never"}, {"CPU": 4, "GPU": 1},
     ["resources.colocate=never"]),
    ({"sampler.gpus": 3, "sampler.gpus_per_worker": 2}, {"CPU": 8, "GPU": 8},
     ["resources.sampler.gpus_per_worker=2"]),
    ({"trainer.cpu_ranks": 4, "trainer.cpus_per_rank": 2}, {"CPU": 4},
     ["resources.trainer.cpus_per_rank=2", "has 4"]),
])
def test_split_that_does_not_fit_names_the_keys(overrides, cluster, names):
    with pytest.raises(ValueError) as err:
        plan_resources(resources(**overrides), cluster)
    for name in names:
        assert name in str(err.value)


def test_placement_groups_on_logical_gpus(ray_local):
    ray = ray_local
    if ray.cluster_resources().get("GPU", 0) < 3:
        pytest.skip("the running Ray cluster has fewer than 3 (logical) GPUs")
    pools = None
    try:
        pools = create_resource_pools(resources(**{"sampler.gpus": 1, "trainer.gpus": 2}))
        assert len(pools.sampler) == 1 and len(pools.trainer) == 2

        @ray.remote
        def gpu_ids():
            return ray.get_gpu_ids()

        ids = [tuple(ray.get(gpu_ids.options(**pool.actor_options(i)).remote()))
               for pool in (pools.sampler, pools.trainer) for i in range(len(pool))]
        # three bundles, three distinct logical GPUs: the pools do not overlap
        assert len({i for t in ids for i in t}) == 3
        pools.remove()
        pools = None
        with pytest.raises(ResourcesDoNotFit, match="resources.trainer.gpus=3"):
            create_resource_pools(resources(**{"sampler.gpus": 1, "trainer.gpus": 3, "colocate": "never"}))
    finally:
        if pools is not None:
            pools.remove()


def test_evaluations_on_the_samplers_gpu_keep_out_of_the_pools_memory():
    """Where kernels are timed on the sampler's own GPU, the sandbox's share is what the engine and
    a colocated trainer leave (less 0.03 for their contexts), never its own default 0.9."""
    from pipeline.resources import evaluator_memory_share

    one_gpu = resources(**{"sampler.gpus": 1, "trainer.gpus": 1, "sampler.gpu_memory_fraction": 0.4,
                           "trainer.gpu_memory_fraction": 0.45})
    share, why = evaluator_memory_share(one_gpu, True, "vllm", 0.85, 0.9)
    assert share == pytest.approx(0.12) and "sampler.gpu_memory_fraction=0.4" in why
    # the HF engine colocated: its fraction caps it the same way
    assert evaluator_memory_share(one_gpu, True, "hf", 0.85, 0.9)[0] == pytest.approx(0.12)
    split = resources(**{"sampler.gpus": 1, "trainer.gpus": 1})
    assert evaluator_memory_share(split, False, "vllm", 0.85, 0.9)[0] == pytest.approx(0.12)
    assert evaluator_memory_share(split, False, "hf", 0.85, 0.9) is None   # HF alone: no share fixed
    own = resources(**{"sampler.gpus": 1, "trainer.gpus": 1, "evaluator.gpus": 1})
    assert evaluator_memory_share(own, False, "vllm", 0.85, 0.9) is None   # GPUs of their own
    assert evaluator_memory_share(resources(), False, "vllm", 0.85, 0.9) is None  # CPU samplers
    assert evaluator_memory_share(split, False, "vllm", 0.5, 0.3) is None   # already small enough


def test_the_job_lowers_the_sandbox_share_or_stops_naming_the_fractions():
    from pipeline.config import ConfigError
    from pipeline.resources import leave_room_for_pools

    def job(fs, ft, backend="cuda", evaluator_gpus=0):
        return OmegaConf.create({
            "env": "kernel", "reward": {"backend": backend},
            "sandbox": {"gpu_memory_share": 0.9, "reference_per_step": False},
            "rollout": {"engine": {"type": "vllm", "vllm": {"gpu_memory_utilization": 0.85}}},
            "resources": OmegaConf.structured(resources(**{
                "sampler.gpus": 1, "trainer.gpus": 1, "sampler.gpu_memory_fraction": fs,
                "trainer.gpu_memory_fraction": ft, "evaluator.gpus": evaluator_gpus}))})

    cfg = job(0.25, 0.3)
    leave_room_for_pools(cfg, colocated=True)
    assert cfg.sandbox.gpu_memory_share == pytest.approx(0.42)
    assert cfg.sandbox.reference_per_step  # answers timed beside the pools: the reference too
    cpu = job(0.5, 0.5, backend="cpu")   # C++ kernels never touch the GPU
    leave_room_for_pools(cpu, colocated=True)
    assert cpu.sandbox.gpu_memory_share == 0.9 and not cpu.sandbox.reference_per_step
    own = job(0.5, 0.5, evaluator_gpus=1)  # evaluations on GPUs of their own: the cached reference holds
    leave_room_for_pools(own, colocated=True)
    assert not own.sandbox.reference_per_step
    with pytest.raises(ConfigError, match="trainer.gpu_memory_fraction=0.5"):
        leave_room_for_pools(job(0.5, 0.5), colocated=True)


def test_build_workers_route_each_sampler_workers_builds_to_ray_actors():
    from pipeline.resources import check_builds, route_builds
    from sandbox.config import DEFAULT_YAML, SandboxConfig
    from sandbox.pool import as_sandbox_config

    def job(env="kernel", **builds):
        return OmegaConf.create({
            "env": env,
            "sandbox": OmegaConf.merge(OmegaConf.structured(SandboxConfig), OmegaConf.load(DEFAULT_YAML)),
            "resources": OmegaConf.structured(resources(**{f"builds.{k}": v for k, v in builds.items()}))})

    cfg = job(workers=5, cpus_per_build=2, node_resource="sandbox_build")
    route_builds(cfg, n_samplers=2)
    sandbox = as_sandbox_config(cfg.sandbox)  # the keys a sampler worker's pool is made from, validated
    assert sandbox.build_pool == "ray" and sandbox.ray_build_workers == 3   # 5 over 2 workers, rounded up
    assert sandbox.ray_build_cpus == 2 and sandbox.ray_build_resource == "sandbox_build"
    default = job()
    route_builds(default, n_samplers=2)
    assert default.sandbox.build_pool == "local"   # workers: 0 leaves the sandbox's own keys alone
    toy = job(env="toy", workers=4)
    route_builds(toy, n_samplers=1)
    assert toy.sandbox.build_pool == "local"
    with pytest.raises(ValueError, match="resources.builds.workers=-1"):  # pipeline.config.check, before Ray
        check_builds(job(workers=-1).resources)
