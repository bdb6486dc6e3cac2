"""Placement arithmetic (pure) and real placement groups on a local Ray with logical GPUs."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.resources import ResourcesDoNotFit, ResourcesConfig, create_resource_pools, plan_resources

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
