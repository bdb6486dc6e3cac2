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
    from pipeline.evaluator_memory import evaluator_memory_share

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
    from pipeline.evaluator_memory import leave_room_for_pools

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


ELEMENTWISE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(ROWS, 393216)]


def get_init_inputs():
    return []
"""


def test_a_task_whose_evaluation_cannot_fit_beside_the_pools_stops_the_job_or_is_left_out(monkeypatch, tmp_path):
    """KernelBench's elementwise level-1 sizes (4096 x 393216 floats, 6 GiB a tensor) fit an 80 GB
    GPU alone but not the 0.32 of it a vLLM engine at 0.25 and a trainer at 0.4 leave: named before
    the model loads, or left out with reward.skip_invalid_tasks; smaller fractions let it in."""
    from pipeline.config import ConfigError
    from pipeline.evaluator_memory import leave_room_for_pools
    from rewards.config import ToyEnvConfig, load_reward_config
    from sandbox import footprint
    from sandbox.config import load_default_config

    level = tmp_path / "level1"
    level.mkdir()
    (level / "19_relu_big.py").write_text(ELEMENTWISE.replace("ROWS", "4096"))
    (level / "20_relu_small.py").write_text(ELEMENTWISE.replace("ROWS", "16"))
    monkeypatch.setattr(footprint, "device_memory_bytes", lambda: [80 * 2**30])

    def job(skip=False, fs=0.25, ft=0.4):
        reward = load_reward_config("kernel", backend="cuda", profile="full", tasks=str(tmp_path), levels=[1],
                                    holdout_frac=0.0, skip_invalid_tasks=skip)
        return OmegaConf.create({
            "env": "kernel", "reward": OmegaConf.structured(reward),
            "sandbox": OmegaConf.structured(load_default_config()), "toy": OmegaConf.structured(ToyEnvConfig),
            "rollout": {"engine": {"type": "vllm", "vllm": {"gpu_memory_utilization": 0.85}}},
            "resources": OmegaConf.structured(resources(**{
                "sampler.gpus": 1, "trainer.gpus": 1, "sampler.gpu_memory_fraction": fs,
                "trainer.gpu_memory_fraction": ft}))})

    with pytest.raises(ConfigError, match=r"1 of the run's 2 tasks .*25\.6 GiB\): L1/19_relu_big 5\d\.\d GiB\. "
                                          r".*reward\.skip_invalid_tasks=true"):
        leave_room_for_pools(job(), colocated=True)
    skipped = job(skip=True)
    leave_room_for_pools(skipped, colocated=True)
    assert list(skipped.reward.task_ids) == ["L1/20_relu_small"]
    roomy = job(fs=0.1, ft=0.1)   # 0.77 of 80 GB: one evaluation of the large task fits
    leave_room_for_pools(roomy, colocated=True)
    assert list(roomy.reward.task_ids) == []
    only_big = job(skip=True)
    (level / "20_relu_small.py").unlink()
    with pytest.raises(ConfigError, match="no train task's evaluation fits"):
        leave_room_for_pools(only_big, colocated=True)


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
