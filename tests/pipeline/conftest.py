from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"


def group(schema: type, name: str, **overrides: Any) -> Any:
    """conf/<name>.yaml onto its schema, dotted overrides applied, as the dataclass object."""
    cfg = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(CONF / f"{name}.yaml"))
    for k, v in overrides.items():
        OmegaConf.update(cfg, k, v, merge=False)
    return OmegaConf.to_object(cfg)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the directory; logical CPUs above the 2 real ones (actors mostly wait).
    Three logical GPUs let placement tests split a cluster; nothing here asks a real GPU."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=8, num_gpus=3, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    if started:
        ray.shutdown()
