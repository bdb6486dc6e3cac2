"""Policy loss of one micro-batch, on verl's PPO clipped objective and loss aggregation.

Normalisation and gradient accumulation: ``policy_loss`` normalises over its own micro-batch
(verl ``agg_loss`` with local counts). The trainer scales each micro-batch loss by its share of
the mini-batch before ``backward`` (``pipeline.trainer.plan.micro_weight``):

* ``seq-mean-token-sum-norm`` / ``seq-mean-token-sum`` / ``seq-mean-token-mean``: weight =
  (sequences with a non-empty loss mask in the micro-batch) / (same count over the mini-batch);
* ``token-mean``: (loss tokens of the micro-batch) / (loss tokens of the mini-batch);
* ``token-sum``: 1.

With that and one constant ``loss_scale_factor`` for the whole step (Dr. GRPO: the step's
max response length, not the padded width of a micro-batch), the accumulated gradient equals the
gradient of the whole mini-batch computed at once (tests/pipeline/algorithms/test_losses.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from pipeline.algorithms.config import AlgorithmConfig

# verl is imported inside the functions: importing this package (e.g. for its config schema)
# stays cheap; verl's import costs seconds.

# verl clamps log(pi/pi_old) to [-20, 20], so the ratio never exceeds e^20: a dual-clip bound
# above that can never bind, which is how "dual clip off" is expressed to verl.
_DUAL_CLIP_OFF = 1.0e12
_LOG_RATIO_BOUND = 20.0


@dataclass
class _VerlActorView:
    """The ActorConfig attributes ``compute_policy_loss_vanilla`` reads."""

    clip_ratio: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    global_batch_info: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def _verl_config(cfg: AlgorithmConfig, loss_scale_factor: int | None) -> _VerlActorView:
    c = cfg.clip_ratio_c
    info = {} if loss_scale_factor is None else {"loss_scale_factor": loss_scale_factor}
    return _VerlActorView(clip_ratio=cfg.clip_ratio_low, clip_ratio_low=cfg.clip_ratio_low,
                          clip_ratio_high=cfg.clip_ratio_high,
                          clip_ratio_c=_DUAL_CLIP_OFF if c is None else float(c), global_batch_info=info)


def clip_fractions(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                   response_mask: torch.Tensor, clip_low: float, clip_high: float) -> tuple[float, float]:
    """Share of loss tokens whose ratio was clipped above (ratio > 1 + high, advantage > 0) and
    below (ratio < 1 - low, advantage < 0): the two cases where the clip cuts the gradient.
    verl reports only their sum."""
    from verl.utils.torch_functional import masked_mean

    with torch.no_grad():
        ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
        high = ((ratio > 1 + clip_high) & (advantages > 0)).float()
        low = ((ratio < 1 - clip_low) & (advantages < 0)).float()
        return float(masked_mean(high, response_mask)), float(masked_mean(low, response_mask))


def policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, cfg: AlgorithmConfig, loss_scale_factor: int | None,
                rollout_is_weights: torch.Tensor | None = None, entropy: torch.Tensor | None = None,
                ref_log_prob: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss and metrics of one micro-batch; all tensors ``[B, R]``.

    PPO clipped ratio with ``cfg.clip_ratio_low/high`` and optional dual clip, aggregated by
    ``cfg.loss_agg_mode``; minus ``entropy_coeff`` x entropy and plus ``kl_coef`` x KL(pi || ref)
    only when those coefficients are > 0. ``rollout_is_weights`` (from :func:`tis_weights`)
    multiply the token losses. ``loss_scale_factor`` is required for ``seq-mean-token-sum-norm``.
    """
    from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, kl_penalty
    from verl.utils.torch_functional import masked_mean

    mode = cfg.loss_agg_mode
    if mode == "seq-mean-token-sum-norm" and loss_scale_factor is None:
        raise ValueError("algorithm.loss_agg_mode=seq-mean-token-sum-norm needs loss_scale_factor "
                         "(the step's max response length): the padded width differs per micro-batch")
    mask = response_mask.to(log_prob.dtype)
    vcfg = _verl_config(cfg, loss_scale_factor)
    pg_loss, vm = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask,
                                              loss_agg_mode=mode, config=vcfg,
                                              rollout_is_weights=rollout_is_weights)
    high, low = clip_fractions(old_log_prob, log_prob, advantages, mask, cfg.clip_ratio_low,
                               cfg.clip_ratio_high)
    metrics = {"actor/pg_loss": float(pg_loss.detach()), "actor/pg_clipfrac": vm["actor/pg_clipfrac"],
               "actor/pg_clipfrac_high": high, "actor/pg_clipfrac_low": low,
               "actor/ppo_kl": vm["actor/ppo_kl"]}
    if cfg.clip_ratio_c is not None:
        metrics["actor/pg_clipfrac_lower"] = vm["actor/pg_clipfrac_lower"]
    loss = pg_loss
    if entropy is not None:
        metrics["actor/entropy"] = float(masked_mean(entropy.detach(), mask))
    if cfg.entropy_coeff > 0:
        if entropy is None:
            raise ValueError(f"algorithm.entropy_coeff={cfg.entropy_coeff} > 0 needs the token entropy")
        ent_loss = agg_loss(entropy, mask, mode, **vcfg.global_batch_info)
        loss = loss - cfg.entropy_coeff * ent_loss
    if cfg.kl_coef > 0:
        if ref_log_prob is None:
            raise ValueError(f"algorithm.kl_coef={cfg.kl_coef} > 0 needs reference log-probs")
        kld = kl_penalty(log_prob, ref_log_prob, cfg.kl_type)
        kl_loss = agg_loss(kld, mask, mode, **vcfg.global_batch_info)
        loss = loss + cfg.kl_coef * kl_loss
        metrics["actor/kl_loss"] = float(kl_loss.detach())
    return loss, metrics


def tis_weights(old_log_prob: torch.Tensor, sampler_log_prob: torch.Tensor, cap: float,
                mask: torch.Tensor) -> torch.Tensor:
    """Truncated importance sampling weights min(pi_old / pi_sampler, cap) per token, zero on
    padding, detached: they correct for the sampler's engine (and its lag) differing from the
    trainer's old policy. verl's ``compute_rollout_correction_weights`` (token level, TIS)."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    weights, _ = compute_rollout_correction_weights(
        log_ratio=(old_log_prob - sampler_log_prob).detach(), response_mask=mask.to(old_log_prob.dtype),
        rollout_is="token", rollout_is_threshold=float(cap))
    return weights


def sft_loss(log_prob: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Supervised fine-tuning loss of one micro-batch: the mean negative log-likelihood of the
    assistant tokens (``response_mask``), verl's ``token-mean`` aggregation, so the trainer's
    ``micro_weight("token-mean", ...)`` accumulates it exactly like the RL loss."""
    from verl.trainer.ppo.core_algos import agg_loss

    mask = response_mask.to(log_prob.dtype)
    loss = agg_loss(-log_prob, mask, "token-mean")
    with torch.no_grad():
        # share of assistant tokens the model already gives more than half its probability:
        # a warm start that can reproduce an answer whole needs this near 1
        sure = ((log_prob.detach() > math.log(0.5)).to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"sft/loss": float(loss.detach()), "sft/token_p_gt_half": float(sure)}
