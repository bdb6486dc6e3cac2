"""One place decides a vLLM engine's tensor-parallel size: the resources preset's GPUs per
sampler worker. A command that sets the engine's size apart from it stops at start, naming both."""
import pytest

from pipeline.config import check
from tests.reliability.test_bad_config import config


@pytest.fixture
def vllm_found(monkeypatch):
    """The config check also asks whether vLLM is installed (a CPU box has none); these tests are
    about the config's values, so the lookup answers as on a GPU machine."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: object() if name == "vllm" else real(name, *a, **k))


def test_tensor_parallel_size_follows_the_resources_preset(vllm_found):
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


@pytest.mark.parametrize("seqs, graphs", [(256, 512), (510, 512), (672, 672), (1000, 1008), (100, 200), (1, 8)])
def test_cuda_graphs_cover_the_whole_decode_batch(seqs, graphs):
    """vLLM's own default stops capturing at min(2 x max_num_seqs, 512) tokens: a decode batch past
    it runs without graphs. The adapter keeps that default and raises it to max_num_seqs (on vLLM's
    stride) where that is larger."""
    from pipeline.engines.vllm import llm_kwargs

    cfg = config("+experiment=kernel_multiturn", "rollout=vllm", f"rollout.engine.vllm.max_num_seqs={seqs}")
    kwargs = llm_kwargs("/ckpt", cfg.rollout.engine.vllm)
    assert kwargs["max_num_seqs"] == seqs
    assert kwargs["compilation_config"] == {"max_cudagraph_capture_size": graphs}


def test_cuda_graph_size_set_by_hand_or_eager():
    from pipeline.engines.vllm import llm_kwargs

    cfg = config("+experiment=kernel_multiturn", "rollout=vllm", "rollout.engine.vllm.max_cudagraph_capture_size=64")
    assert llm_kwargs("/ckpt", cfg.rollout.engine.vllm)["compilation_config"] == {"max_cudagraph_capture_size": 64}
    eager = config("+experiment=kernel_multiturn", "rollout=vllm", "rollout.engine.vllm.enforce_eager=true")
    kwargs = llm_kwargs("/ckpt", eager.rollout.engine.vllm)
    assert kwargs["enforce_eager"] is True and "compilation_config" not in kwargs
