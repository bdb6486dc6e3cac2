"""Group-relative advantages: each sample's return against the other samples of its task.

In the multi-turn setting a group is every sample of one task in the batch (trajectories x
turns), as in Kevin-32B. The statistics come from verl's ``compute_grpo_outcome_advantage``
(unbiased std, ``(R - mean) / (std + eps)`` or ``R - mean`` for Dr. GRPO), fed the return as a
one-token reward. Two cases are decided here instead, because verl's answer is noise there:
a group of one sample and a constant group get advantage exactly 0 (verl gives a singleton its
raw return, and a constant group rounding error divided by ~eps). A group is constant when its
returns agree to :data:`CONSTANT_RTOL` of its scale, ``max - min <= CONSTANT_RTOL * max(1, max|R|)``,
not only when they are exactly equal: 63 returns of 1.0 and one of 1.0 + 1 ulp are a constant
group (verl would give them |A| ~ 0.12, all noise), while 1.0 and 1.1 are not.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch

CONSTANT_RTOL = 1e-6  # relative spread below which a group's returns count as equal


def group_index(group_ids: Sequence[Hashable]) -> np.ndarray:
    """Object array of group ids, the ``index`` verl's advantage estimators group by."""
    index = np.empty(len(group_ids), dtype=object)
    index[:] = list(group_ids)
    return index


def group_advantages(returns: torch.Tensor, group_ids: Sequence[Hashable], norm_by_std: bool,
                     eps: float) -> torch.Tensor:
    """Advantages ``[N]`` of returns ``[N]``; ``group_ids[i]`` names sample i's group (task)."""
    if returns.dim() != 1 or returns.shape[0] != len(group_ids):
        raise ValueError(f"returns of shape {tuple(returns.shape)} and {len(group_ids)} group ids: "
                         "expected a 1-d tensor with one return per group id")
    if returns.shape[0] == 0:
        return returns.clone()
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    returns = returns.float() if not returns.is_floating_point() else returns
    index = group_index(group_ids)
    adv, _ = compute_grpo_outcome_advantage(
        token_level_rewards=returns.unsqueeze(-1).clone(), response_mask=torch.ones_like(returns).unsqueeze(-1),
        index=index, epsilon=eps, norm_adv_by_std_in_grpo=norm_by_std)
    adv = adv.squeeze(-1)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    for rows in members.values():
        if len(rows) == 1 or is_constant(returns[rows]):
            adv[rows] = 0.0
    return adv


def is_constant(r: torch.Tensor, rtol: float = CONSTANT_RTOL) -> bool:
    """Whether a group's returns are equal up to ``rtol`` of the group's scale (at least 1)."""
    r = r.double()
    spread = float(r.max() - r.min())
    return spread <= rtol * max(1.0, float(r.abs().max()))
