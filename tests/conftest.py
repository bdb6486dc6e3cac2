import os
import shutil

import pytest

# Tests never talk to W&B servers or model hubs.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _interpreter_problem() -> str | None:
    from sandbox import devices

    return devices.interpreter_problem()


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    cuda = _has_cuda()
    interpreter = None if cuda else _interpreter_problem()
    try:
        import vllm  # noqa: F401

        has_vllm = cuda
    except Exception:
        has_vllm = False
    for item in items:
        # markers, not keywords: keywords also hold the names of the folders above (a checkout
        # in a folder named vllm or gpu would skip everything)
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if item.get_closest_marker("vllm") and not has_vllm:
            item.add_marker(pytest.mark.skip(reason="needs vLLM and a CUDA GPU"))
        if item.get_closest_marker("triton_interpreter") and interpreter:
            item.add_marker(pytest.mark.skip(reason=interpreter))


@pytest.fixture(scope="session")
def kernel_cache_dir(tmp_path_factory):
    """One compile cache for the whole session: CI has 2 cores, compiles are shared."""
    d = tmp_path_factory.mktemp("kernel_cache")
    yield str(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the session (pipeline tests); logical CPUs above the 2 real
    ones (actors mostly wait). Three logical GPUs let placement tests split a cluster; nothing here asks a real GPU."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=8, num_gpus=3, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    if started:
        ray.shutdown()
