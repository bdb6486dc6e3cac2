"""conf/experiment/kernel_multiturn_qwen1p5b.yaml composes into Kevin's multi-turn recipe on the GPU."""
from pathlib import Path

from hydra import compose, initialize_config_dir

from pipeline.config import register

CONF = Path(__file__).resolve().parents[2] / "conf"


def _compose(*overrides: str):
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=["+experiment=kernel_multiturn_qwen1p5b", *overrides])


def test_qwen1p5b_experiment_composes_to_multiturn_grpo_plus_on_vllm():
    cfg = _compose()
    a = cfg.algorithm
    assert (a.gamma, a.aggregate, a.clip_ratio_low, a.clip_ratio_high) == (0.4, "sum", 0.2, 0.28)
    assert a.loss_agg_mode == "seq-mean-token-sum-norm" and a.kl_coef == 0 and a.entropy_coeff == 0
    assert a.grad_clip == 0.05 and a.ppo_mini_batches == 2 and a.mini_batch_by_group
    assert cfg.rollout.turns == 4 and cfg.rollout.engine.type == "vllm"
    assert cfg.pipeline.max_staleness == 1  # one_off
    assert cfg.reward.backend == "cuda" and cfg.reward.profile == "full"
    assert cfg.rollout.max_prompt_length + cfg.rollout.max_response_length <= cfg.rollout.engine.vllm.max_model_len
    assert cfg.trainer.optim.lr == 2.0e-6 and cfg.model.warm_start is None
    assert str(cfg.model.path).endswith("qwen2.5-coder-1.5b-instruct")  # the preset's cache dir
    # one GPU for engine, trainer and evaluations: a full fine-tune of the 1.5B within 0.4 of an H100
    # (checkpointed, 8192-token micro-batches), and at least a third of the GPU left for evaluations,
    # tasks whose evaluation cannot fit there left out (the split made before)
    assert cfg.trainer.gradient_checkpointing and a.micro_batch_tokens <= 8192
    r = cfg.resources
    assert r.sampler.gpu_memory_fraction + r.trainer.gpu_memory_fraction <= 0.61 and cfg.reward.skip_invalid_tasks


def test_qwen1p5b_experiment_passes_the_config_checks_but_the_machines():
    """On a CPU box only the machine's lacks are reported: no checkpoint directory, no GPUs, no vLLM."""
    import pytest

    from pipeline.config import ConfigError, check

    with pytest.raises(ConfigError) as e:
        check(_compose())
    errors = [x.strip() for x in str(e.value).splitlines()[1:]]
    assert errors and all(x.startswith(("model.path=", "resources.", "rollout.engine.type=vllm")) for x in errors), errors
