"""Which samples leave the loss before training: overlong (truncated) responses and groups with
nothing to learn from."""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import torch

from pipeline.algorithms.config import OVERLONG_FILTERS


def overlong_loss_mask(truncated: torch.Tensor, response_mask: torch.Tensor, mode: str,
                       scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(response_mask, filtered[B])``: the loss mask with filtered rows zeroed, and which rows.

    * ``mask`` (DAPO overlong filtering, DeepCoder GRPO+): every truncated response is masked
      out of the loss, neither rewarded nor punished for being cut.
    * ``deepcoder``: only truncated responses that scored 0 are masked; a truncated response that
      still earned a score (in a multi-turn episode the evaluator may accept what was written)
      keeps its loss. Needs ``scores``.
    * ``off``: nothing filtered; a truncated response is trained on with its score.

    The caller zeroes the advantages of filtered rows too, so mask and advantage agree.
    """
    if mode not in OVERLONG_FILTERS:
        raise ValueError(f"algorithm.overlong_filter={mode!r}: expected one of {list(OVERLONG_FILTERS)}")
    truncated = truncated.bool()
    if truncated.shape != response_mask.shape[:1]:
        raise ValueError(f"truncated of shape {tuple(truncated.shape)} for a response mask of "
                         f"shape {tuple(response_mask.shape)}: expected one flag per row")
    if mode == "off":
        filtered = torch.zeros_like(truncated)
    elif mode == "mask":
        filtered = truncated
    else:
        if scores is None:
            raise ValueError("algorithm.overlong_filter=deepcoder needs the rows' scores")
        filtered = truncated & (scores == 0)
    mask = response_mask * (~filtered).unsqueeze(-1).to(response_mask.dtype)
    return mask, filtered


class ZeroAdvantageGroups(NamedTuple):
    groups: list[Hashable]      # ids of the groups to drop, in first-seen order
    keep: torch.Tensor          # [N] bool: samples outside those groups
    n_samples: int              # samples dropped


def zero_advantage_groups(advantages: torch.Tensor, group_ids: Sequence[Hashable],
                          has_loss: torch.Tensor | None = None, tol: float = 0.0) -> ZeroAdvantageGroups:
    """Groups in which every sample that still has a loss (``has_loss``, default all) has
    ``|advantage| <= tol``: their gradient is zero, so training on them only costs compute."""
    n = len(group_ids)
    if advantages.shape != (n,):
        raise ValueError(f"advantages of shape {tuple(advantages.shape)} for {n} group ids")
    live = torch.ones(n, dtype=torch.bool) if has_loss is None else has_loss.bool()
    informative = (advantages.abs() > tol) & live
    seen: dict[Hashable, bool] = {}
    for i, g in enumerate(group_ids):
        seen[g] = seen.get(g, False) or bool(informative[i])
    dropped = [g for g, useful in seen.items() if not useful]
    drop_set = set(dropped)
    keep = torch.tensor([g not in drop_set for g in group_ids], dtype=torch.bool)
    return ZeroAdvantageGroups(dropped, keep, int((~keep).sum()))
