"""One place decides a vLLM engine's tensor-parallel size: the resources preset's GPUs per
sampler worker. A command that sets the engine's size apart from it stops at start, naming both."""
import pytest

from pipeline.config import check
from tests.reliability.test_bad_config import config


def test_tensor_parallel_size_follows_the_resources_preset():
    cfg = config("+experiment=kernel_multiturn", "rollout=vllm", "resources=node8", "resources.ray.num_gpus=8")
    assert cfg.resources.sampler.gpus_per_worker == 2 and cfg.rollout.engine.vllm.tensor_parallel_size == 2
    check(cfg)
    one = config("+experiment=kernel_multiturn", "rollout=vllm", "resources=one_gpu", "resources.ray.num_gpus=1")
    assert one.rollout.engine.vllm.tensor_parallel_size == 1
    check(one)


def test_a_tensor_parallel_size_apart_from_the_preset_is_named():
    cfg = config("+experiment=kernel_multiturn", "rollout=vllm", "resources=node8", "resources.ray.num_gpus=8",
                 "rollout.engine.vllm.tensor_parallel_size=1")
    with pytest.raises(ValueError) as err:
        check(cfg)
    msg = str(err.value)
    assert "rollout.engine.vllm.tensor_parallel_size=1" in msg and "resources.sampler.gpus_per_worker=2" in msg
