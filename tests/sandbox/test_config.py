import pytest
from omegaconf.errors import ConfigKeyError, ValidationError

from sandbox.config import load_default_config


def test_defaults_load_with_the_documented_values():
    cfg = load_default_config()
    assert cfg.correctness_trials == 5
    assert cfg.tolerance["float32"].atol == 1e-4 and cfg.tolerance["float32"].rtol == 1e-4
    assert cfg.tolerance["bfloat16"].atol == 1e-2 and cfg.tolerance["float16"].rtol == 1e-2


def test_a_wrong_key_is_named():
    with pytest.raises(ConfigKeyError, match="correctnes_trials"):
        load_default_config(correctnes_trials=3)


def test_a_wrong_type_is_named():
    with pytest.raises(ValidationError, match="timing_runs"):
        load_default_config(timing_runs="many")


def test_a_wrong_backend_is_named():
    with pytest.raises(ValueError, match="sandbox.backend='rocm'"):
        load_default_config(backend="rocm")


def test_the_pool_takes_a_hydra_node_and_names_a_wrong_key(tmp_path):
    from omegaconf import OmegaConf

    from sandbox.config import DEFAULT_YAML
    from sandbox.pool import SandboxPool

    node = OmegaConf.merge(OmegaConf.load(DEFAULT_YAML), {"cache_dir": str(tmp_path)})
    assert SandboxPool(node).cfg.tolerance["float16"].atol == 1e-2
    with pytest.raises(ConfigKeyError, match="max_concurrnt"):
        SandboxPool(OmegaConf.merge(node, {"max_concurrnt": 2}))
