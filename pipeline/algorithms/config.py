"""Algorithm schema: GRPO+ for multi-turn episodes. Types only; values in conf/algorithm/*.yaml."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING

AGGREGATES = ("sum", "max")
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                  "seq-mean-token-mean")
OVERLONG_FILTERS = ("mask", "deepcoder", "off")
OFF_POLICY_CORRECTIONS = ("off", "tis", "bypass")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "low_var_kl+")


@dataclass
class AlgorithmConfig:
    gamma: float = MISSING                 # turn discount of the multi-turn return, in (0, 1]
    aggregate: str = MISSING               # sum | max: how later turns' scores enter R_t
    norm_by_std: bool = MISSING            # divide by the group's std (GRPO) or not (Dr. GRPO)
    adv_eps: float = MISSING               # added to the std before dividing
    clip_ratio_low: float = MISSING        # ratio clipped below at 1 - clip_ratio_low
    clip_ratio_high: float = MISSING       # ratio clipped above at 1 + clip_ratio_high (DAPO clip-higher)
    clip_ratio_c: Optional[float] = MISSING  # dual-clip bound for negative advantages (> 1); null = off
    loss_agg_mode: str = MISSING           # one of LOSS_AGG_MODES (verl agg_loss)
    kl_coef: float = MISSING               # KL-to-reference loss coefficient; 0 = no reference model
    kl_type: str = MISSING                 # verl kl_penalty estimator (k1, k2, k3, low_var_kl, ...)
    entropy_coeff: float = MISSING         # entropy bonus coefficient; 0 = entropy only logged
    overlong_filter: str = MISSING         # mask | deepcoder | off (see filters.overlong_loss_mask)
    drop_zero_adv_groups: bool = MISSING   # drop groups whose samples all have advantage 0
    off_policy_correction: str = MISSING   # off | tis | bypass
    tis_cap: float = MISSING               # truncated importance sampling cap C on pi_old / pi_sampler
    not_okay_prefix: str = MISSING         # health: reasoning expected to start with this
    ppo_mini_batches: int = MISSING        # optimiser steps per batch
    mini_batch_by_group: bool = MISSING    # mini-batches hold whole advantage groups (docs/algorithms.md "Stability")
    grad_clip: float = MISSING             # max global grad norm
    micro_batch_tokens: int = MISSING      # token budget of one forward/backward (prompt + response)


def check_algorithm_config(cfg: AlgorithmConfig) -> None:
    """Semantic checks a type cannot express; one ValueError naming every bad key."""
    errors = []

    def choice(key: str, allowed: tuple[str, ...]) -> None:
        value = getattr(cfg, key)
        if value not in allowed:
            errors.append(f"algorithm.{key}={value!r}: expected one of {list(allowed)}")

    if not 0 < cfg.gamma <= 1:
        errors.append(f"algorithm.gamma={cfg.gamma}: expected 0 < gamma <= 1")
    choice("aggregate", AGGREGATES)
    choice("loss_agg_mode", LOSS_AGG_MODES)
    choice("overlong_filter", OVERLONG_FILTERS)
    choice("off_policy_correction", OFF_POLICY_CORRECTIONS)
    choice("kl_type", KL_TYPES)
    if cfg.adv_eps < 0:
        errors.append(f"algorithm.adv_eps={cfg.adv_eps}: expected >= 0")
    if not 0 <= cfg.clip_ratio_low < 1:
        errors.append(f"algorithm.clip_ratio_low={cfg.clip_ratio_low}: expected 0 <= value < 1")
    if cfg.clip_ratio_high < cfg.clip_ratio_low:
        errors.append(f"algorithm.clip_ratio_high={cfg.clip_ratio_high} < algorithm.clip_ratio_low="
                      f"{cfg.clip_ratio_low}: the upper clip must be at least the lower one")
    if cfg.clip_ratio_c is not None and cfg.clip_ratio_c <= 1:
        errors.append(f"algorithm.clip_ratio_c={cfg.clip_ratio_c}: expected > 1 (dual clip) or null (off)")
    if cfg.kl_coef < 0:
        errors.append(f"algorithm.kl_coef={cfg.kl_coef}: expected >= 0")
    if cfg.entropy_coeff < 0:
        errors.append(f"algorithm.entropy_coeff={cfg.entropy_coeff}: expected >= 0")
    if cfg.tis_cap <= 0:
        errors.append(f"algorithm.tis_cap={cfg.tis_cap}: expected > 0")
    if cfg.ppo_mini_batches < 1:
        errors.append(f"algorithm.ppo_mini_batches={cfg.ppo_mini_batches}: expected >= 1")
    if cfg.grad_clip <= 0:
        errors.append(f"algorithm.grad_clip={cfg.grad_clip}: expected > 0")
    if cfg.micro_batch_tokens < 1:
        errors.append(f"algorithm.micro_batch_tokens={cfg.micro_batch_tokens}: expected >= 1")
    if errors:
        raise ValueError("invalid algorithm configuration:\n  " + "\n  ".join(errors))
