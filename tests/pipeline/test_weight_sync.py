"""Trainer -> samplers weight push through real Ray actors: object store, then a gloo broadcast
group. After a push, the samplers' log-probs are those of the trainer's weights."""
import asyncio

import pytest
import torch

from pipeline.models import ModelConfig, load_model_and_tokenizer
from pipeline.pools import ResourcesConfig, create_pools
from pipeline.rollout_config import load_rollout_config
from pipeline.sampler import SamplerPool
from pipeline.trainer import TrainerConfig, TrainerGroup
from pipeline.weight_sync import WeightSync, choose_transport
from rewards.interface import TaskRef
from tests.pipeline.conftest import group

TEMPERATURE = 1.0


def teacher_forced(model, s):
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1:-1].float() / TEMPERATURE
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
    return lp


def max_gap(model, samples):
    return max((teacher_forced(model, s) - torch.tensor(s.logprobs)).abs().max().item()
               for s in samples if s.response_ids)


async def generate(pool, version, tasks):
    return [s async for s in pool.generate(version, tasks, version)]


def test_push_reaches_every_sampler(ray_local):
    base = group(ModelConfig, "model/tiny")
    other = group(ModelConfig, "model/tiny", **{"tiny.seed": 1})
    rollout = load_rollout_config("hf", ["n_trajectories=2", "turns=1", "max_response_length=8",
                                         f"temperature={TEMPERATURE}", "response_length_schedule=[]"])
    pools = create_pools(group(ResourcesConfig, "resources/default", **{"sampler.cpu_workers": 2}))
    samplers = SamplerPool(base, rollout, {"_target_": "rewards.toy.ToyEnv"}, pool=pools.sampler)
    trainer = TrainerGroup(pools.trainer, other, group(TrainerConfig, "trainer/fsdp2"), None,
                           max_response_length=8, temperature=TEMPERATURE, total_optim_steps=1)
    model0, _ = load_model_and_tokenizer(base)
    model1, _ = load_model_and_tokenizer(other)
    tasks = [TaskRef("toy/a", {"prompt": "say a"}), TaskRef("toy/b", {"prompt": "say b"})]
    try:
        before = asyncio.run(generate(samplers, 0, tasks))
        assert max_gap(model0, before) < 1e-4 and max_gap(model1, before) > 1e-2

        assert choose_transport("auto", colocated=False, on_gpu=False) == "object_store"
        sync = WeightSync(trainer, samplers, "object_store")
        seconds = asyncio.run(sync.push(1))
        assert seconds > 0
        after = asyncio.run(generate(samplers, 1, tasks))
        assert {s.policy_version for s in after} == {1}
        assert len({s.task_id for s in after}) == 2  # both workers generated
        assert max_gap(model1, after) < 1e-4

        # back to the base weights with a plain state dict, then the broadcast transport
        asyncio.run(samplers.update_weights(dict(model0.state_dict()), 2))
        assert max_gap(model0, asyncio.run(generate(samplers, 2, tasks))) < 1e-4
        bsync = WeightSync(trainer, samplers, "broadcast", timeout_s=120)
        asyncio.run(bsync.push(3))
        again = asyncio.run(generate(samplers, 3, tasks))
        assert {s.policy_version for s in again} == {3}
        assert max_gap(model1, again) < 1e-4

        # a lost sampler is replaced (with the base weights: version 0); the next push forms the
        # group again with the replacement in it instead of hanging on the lost member
        import ray

        ray.kill(samplers.workers[0])
        replaced = asyncio.run(generate(samplers, 4, tasks))
        assert samplers.restarts == 1 and len(replaced) == len(before)
        assert 0 in {s.policy_version for s in replaced}
        asyncio.run(bsync.push(5))
        last = asyncio.run(generate(samplers, 5, tasks))
        assert {s.policy_version for s in last} == {5} and len({s.task_id for s in last}) == 2
        assert max_gap(model1, last) < 1e-4
    finally:
        samplers.shutdown()
        trainer.shutdown()
        pools.remove()


def test_unknown_transport_is_named():
    with pytest.raises(ValueError, match="pipeline.weight_sync='nvlink'"):
        choose_transport("nvlink", colocated=False, on_gpu=True)
