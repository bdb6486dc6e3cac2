import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError

from pipeline.algorithms import AlgorithmConfig, check_algorithm_config
from tests.pipeline.algorithms.conftest import CONF, algo


@pytest.mark.parametrize("name", ["grpo_plus", "grpo"])
def test_shipped_configs_are_complete_and_valid(name):
    cfg = algo(name)
    check_algorithm_config(cfg)
    assert not OmegaConf.missing_keys(OmegaConf.structured(cfg))


def test_grpo_plus_has_kevin_and_deepcoder_settings():
    c = algo("grpo_plus")
    assert (c.gamma, c.aggregate, c.clip_ratio_low, c.clip_ratio_high) == (0.4, "sum", 0.2, 0.28)
    assert c.loss_agg_mode == "seq-mean-token-sum-norm" and c.overlong_filter == "mask"
    assert c.kl_coef == 0 and c.entropy_coeff == 0 and c.clip_ratio_c is None
    assert c.ppo_mini_batches == 2 and c.grad_clip == 0.05 and c.not_okay_prefix == "Okay"
    g = algo("grpo")
    assert g.loss_agg_mode == "token-mean" and g.clip_ratio_high == g.clip_ratio_low and g.norm_by_std


@pytest.mark.parametrize("key,value", [
    ("gamma", 0.0), ("gamma", 1.5), ("aggregate", "mean"), ("loss_agg_mode", "seq-sum"),
    ("overlong_filter", "penalty"), ("off_policy_correction", "is"), ("kl_type", "k9"),
    ("clip_ratio_high", 0.1), ("clip_ratio_c", 1.0), ("tis_cap", 0.0), ("micro_batch_tokens", 0),
])
def test_bad_value_names_the_key(key, value):
    with pytest.raises(ValueError) as err:
        check_algorithm_config(algo(**{key: value}))
    assert f"algorithm.{key}=" in str(err.value)


def test_unknown_key_fails_naming_it():
    with pytest.raises(ConfigKeyError, match="clip_high"):
        OmegaConf.merge(OmegaConf.structured(AlgorithmConfig), OmegaConf.load(CONF / "grpo_plus.yaml"),
                        OmegaConf.create({"clip_high": 0.3}))
