"""resources.evaluator: a dedicated pool of whole GPUs for the kernel evaluator, planned like the
other pools, placed by Ray (logical GPUs on CPU here) and handed to the sampler workers' envs."""
import pytest

from pipeline.resources import (ResourcesDoNotFit, assign_evaluator_gpus, bundle_nodes, create_resource_pools,
                            evaluator_gpu_ids, plan_resources)
from tests.pipeline.test_resources import resources


def test_plan_reserves_whole_gpus_beside_the_other_pools():
    plan = plan_resources(resources(**{"sampler.gpus": 4, "sampler.gpus_per_worker": 2, "trainer.gpus": 2,
                                   "evaluator.gpus": 2, "evaluator.cpus_per_gpu": 3}), {"CPU": 32, "GPU": 8})
    assert plan.evaluator_bundles == [{"GPU": 1.0, "CPU": 3.0}] * 2 and not plan.colocated
    assert plan_resources(resources(), {"CPU": 8}).evaluator_bundles == []  # default: none


def test_evaluator_gpus_are_not_shared_and_a_misfit_names_the_keys():
    with pytest.raises(ResourcesDoNotFit, match=r"resources.evaluator.gpus=4 GPUs requested, but the Ray cluster has 2"):
        plan_resources(resources(**{"evaluator.gpus": 4}), {"CPU": 8, "GPU": 2})
    # 1 + 1 on two GPUs fits; with one of them for evaluation, the pools share the other
    plan = plan_resources(resources(**{"sampler.gpus": 1, "trainer.gpus": 1, "evaluator.gpus": 1}),
                      {"CPU": 8, "GPU": 2})
    assert plan.colocated and len(plan.evaluator_bundles) == 1
    with pytest.raises(ResourcesDoNotFit, match="after resources.evaluator.gpus=1"):
        plan_resources(resources(**{"sampler.gpus": 2, "trainer.gpus": 1, "evaluator.gpus": 1}),
                   {"CPU": 8, "GPU": 3})
    with pytest.raises(ResourcesDoNotFit, match="resources.evaluator.cpus_per_gpu=8"):
        plan_resources(resources(**{"evaluator.gpus": 1, "evaluator.cpus_per_gpu": 8}), {"CPU": 8, "GPU": 1})


def test_assignment_splits_a_nodes_gpus_among_its_workers():
    eval_gpus = [("a", 6), ("a", 7), ("b", 3)]
    assert assign_evaluator_gpus(["a", "a", "b"], eval_gpus) == [[6], [7], [3]]
    assert assign_evaluator_gpus(["a"], eval_gpus) == [[6, 7]]
    assert assign_evaluator_gpus(["b", "b"], eval_gpus) == [[3], [3]]  # fewer GPUs than workers: shared
    with pytest.raises(ResourcesDoNotFit, match="no evaluation GPU was placed on the node"):
        assign_evaluator_gpus(["a", "c"], eval_gpus)


def test_evaluation_pool_on_logical_gpus(ray_local):
    ray = ray_local
    if ray.cluster_resources().get("GPU", 0) < 3:
        pytest.skip("the running Ray cluster has fewer than 3 (logical) GPUs")
    pools = create_resource_pools(resources(**{"sampler.gpus": 1, "trainer.gpus": 1, "evaluator.gpus": 1,
                                      "colocate": "never"}))
    try:
        assert pools.evaluator is not None and len(pools.evaluator) == 1

        @ray.remote(num_gpus=1, num_cpus=0)
        def gpus():
            return list(ray.get_gpu_ids())

        taken = set()
        for pool in (pools.sampler, pools.trainer):
            taken.update(int(g) for g in ray.get(gpus.options(**{**pool.actor_options(0), "num_cpus": 0}).remote()))
        found = evaluator_gpu_ids(pools.evaluator)
        assert len(found) == 1 and found[0][1] not in taken  # a GPU no engine or rank has
        shares = assign_evaluator_gpus(bundle_nodes(pools.sampler), found)
        assert shares == [[found[0][1]]]
    finally:
        pools.remove()


def test_each_sampler_worker_env_gets_its_share(monkeypatch):
    from omegaconf import OmegaConf

    import rewards.env
    from pipeline.sampler_worker import build_env
    from rewards.interface import env_spec

    seen = []
    monkeypatch.setattr(rewards.env.KernelEnv, "from_config",
                        classmethod(lambda cls, reward, sandbox: seen.append(list(sandbox.gpu_ids))))
    cfg = OmegaConf.create({"env": "kernel", "reward": {}, "sandbox": {"gpu_ids": []}})
    spec = env_spec(cfg.env, cfg.reward, cfg.sandbox, None, [[6], [7]])
    build_env(spec, 1)
    build_env(env_spec(cfg.env, cfg.reward, cfg.sandbox, None), 0)  # no evaluation pool: the config's own gpu_ids
    assert seen == [[7], []]
