"""Multi-turn returns: the credit a turn gets from its own and all later turns' scores.

verl's return helpers work on token-level rewards of one response; a turn-level discounted
return over a trajectory of responses has no verl counterpart, so it is written here.
"""
from __future__ import annotations

import torch

from pipeline.algorithms.config import AGGREGATES


def multi_turn_returns(scores: torch.Tensor, gamma: float, aggregate: str,
                       turn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """R_t = sum_{k>=t} gamma^(k-t) s_k (``sum``) or max_{k>=t} gamma^(k-t) s_k (``max``).

    ``scores[..., T]``: per-turn scores, turns on the last axis. ``turn_mask[..., T]`` (bool):
    which turns exist; a trajectory that ended early has False after its last turn. Missing turns
    contribute nothing and get return 0. Same shape and dtype as ``scores`` out.
    """
    if aggregate not in AGGREGATES:
        raise ValueError(f"algorithm.aggregate={aggregate!r}: expected one of {list(AGGREGATES)}")
    if not 0 < gamma <= 1:
        raise ValueError(f"algorithm.gamma={gamma}: expected 0 < gamma <= 1")
    scores = scores.to(torch.float64) if not scores.is_floating_point() else scores
    if turn_mask is None:
        turn_mask = torch.ones_like(scores, dtype=torch.bool)
    elif turn_mask.shape != scores.shape:
        raise ValueError(f"turn_mask shape {tuple(turn_mask.shape)} != scores shape {tuple(scores.shape)}")
    turn_mask = turn_mask.bool()
    out = torch.zeros_like(scores)
    T = scores.shape[-1]
    # gamma > 0, so gamma^(k-t) s_k = gamma * gamma^(k-(t+1)) s_k: one backward pass suffices
    if aggregate == "sum":
        later = torch.zeros_like(scores[..., 0])
        for t in range(T - 1, -1, -1):
            s = torch.where(turn_mask[..., t], scores[..., t], torch.zeros_like(later))
            later = s + gamma * later
            out[..., t] = torch.where(turn_mask[..., t], later, torch.zeros_like(later))
    else:
        empty = torch.full_like(scores[..., 0], float("-inf"))
        later = empty
        for t in range(T - 1, -1, -1):
            s = torch.where(turn_mask[..., t], scores[..., t], empty)
            later = torch.maximum(s, gamma * later)
            out[..., t] = torch.where(turn_mask[..., t], later, torch.zeros_like(later))
    return out
