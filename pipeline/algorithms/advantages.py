"""Group-relative advantages: each sample's return against the other samples of its task.

In the multi-turn setting a group is every sample of one task in the batch (trajectories x
turns), as in Kevin-32B. The statistics come from verl's ``compute_grpo_outcome_advantage``
(unbiased std, ``(R - mean) / (std + eps)`` or ``R - mean`` for Dr. GRPO), fed the return as a
one-token reward. Two cases are decided here instead, because verl's answer is noise there:
a group of one sample and a group whose returns are all equal get advantage exactly 0 (verl
gives a singleton its raw return, and a constant group rounding error divided by ~eps).
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch


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
        r = returns[rows]
        if len(rows) == 1 or bool((r == r[0]).all()):
            adv[rows] = 0.0
    return adv
