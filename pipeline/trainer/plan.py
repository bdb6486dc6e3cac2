"""How one training step's rows are split: mini-batches (optimiser steps) x data-parallel ranks x
micro-batches (gradient accumulation under a token budget).

FSDP runs collectives inside every forward and backward, so every rank must run the same number
of micro-batches; a rank with less data gets zero-weight filler rows (copies of a real row whose
loss is multiplied by 0). The plan is made once on the driver, so all ranks agree on it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RankPlan:
    rows: list[int]                       # global row indices this rank holds (fillers repeat rows)
    filler: list[bool]                    # per held row: a zero-weight copy
    mini_batches: list[list[list[int]]]   # [mini][micro] -> positions into ``rows``


@dataclass
class StepPlan:
    ranks: list[RankPlan]
    global_seqs: list[int]                # per mini-batch: sequences with a non-empty loss mask
    global_tokens: list[int]              # per mini-batch: loss tokens


def _split_even(items: list[int], parts: int) -> list[list[int]]:
    """Contiguous near-equal parts (rows come grouped by task; contiguity keeps groups together)."""
    n = len(items)
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [items[bounds[i]:bounds[i + 1]] for i in range(parts)]


def split_by_group(groups: list[str], parts: int) -> list[list[int]]:
    """At most ``parts`` contiguous mini-batches of whole groups, near-equal in rows; as many as
    there are groups when fewer. A group's advantages sum to zero only over the whole group: split
    across optimiser steps, a nearly all-correct group puts its lone wrong answer (A = -3.75 among
    16 under std normalisation) in a step with too few positive partners to cancel the push on the
    tokens they share, and Adam (which normalises the step's size) applies it in full. Rows must
    come grouped (``build_train_batch`` sorts them by task)."""
    bounds = [0] + [i for i in range(1, len(groups)) if groups[i] != groups[i - 1]] + [len(groups)]
    if len(set(groups)) != len(bounds) - 1:
        raise ValueError("plan_step: the rows of a group are not contiguous (sort them by group)")
    n_groups = len(bounds) - 1
    parts = max(1, min(parts, n_groups))
    n = len(groups)
    minis: list[list[int]] = []
    g = 0
    for p in range(parts):
        target = round((p + 1) * n / parts)
        end = g + 1  # at least one group; leave one for each later part
        while end < n_groups - (parts - p - 1) and abs(bounds[end + 1] - target) <= abs(bounds[end] - target):
            end += 1
        if p == parts - 1:
            end = n_groups
        minis.append(list(range(bounds[g], bounds[end])))
        g = end
    return minis


def plan_step(lengths: list[int], loss_tokens: list[int], world_size: int, n_mini: int,
              token_budget: int, groups: list[str] | None = None) -> StepPlan:
    """``lengths``: tokens per row (prompt+response, what a forward costs); ``loss_tokens``: loss
    mask tokens per row. Mini-batches shrink to the row count when there are fewer rows.
    ``groups`` (the rows' advantage groups, contiguous): mini-batches hold whole groups
    (:func:`split_by_group`), so there are at most as many as groups; None splits rows evenly."""
    from pipeline.algorithms import balance_across_ranks, micro_batches

    n = len(lengths)
    if n == 0:
        raise ValueError("plan_step: the batch has no rows")
    if groups is not None:
        if len(groups) != n:
            raise ValueError(f"plan_step: {len(groups)} group ids for {n} rows")
        minis = split_by_group(list(groups), n_mini)
    else:
        n_mini = max(1, min(n_mini, n))
        minis = _split_even(list(range(n)), n_mini)
    ranks = [RankPlan([], [], []) for _ in range(world_size)]
    global_seqs, global_tokens = [], []
    for mini in minis:
        global_seqs.append(sum(1 for i in mini if loss_tokens[i] > 0))
        global_tokens.append(sum(loss_tokens[i] for i in mini))
        parts = balance_across_ranks([lengths[i] for i in mini], world_size)
        per_rank: list[list[list[int]]] = []
        for r in range(world_size):
            mine = [mini[j] for j in parts[r]]
            if mine:
                micro = micro_batches([lengths[i] for i in mine], token_budget)
                per_rank.append([[mine[j] for j in m] for m in micro])
            else:
                per_rank.append([])
        n_micro = max(len(m) for m in per_rank)
        for r, micros in enumerate(per_rank):
            plan = ranks[r]
            positions: list[list[int]] = []
            for m in micros:
                positions.append(list(range(len(plan.rows), len(plan.rows) + len(m))))
                plan.rows.extend(m)
                plan.filler.extend([False] * len(m))
            while len(positions) < n_micro:  # filler micro-batch: one zero-weight row
                positions.append([len(plan.rows)])
                plan.rows.append(mini[0])
                plan.filler.append(True)
            plan.mini_batches.append(positions)
    return StepPlan(ranks, global_seqs, global_tokens)


def micro_weight(loss_agg_mode: str, seqs: int, tokens: int, global_seqs: int,
                 global_tokens: int) -> float:
    """Factor turning a micro-batch's locally normalised loss into its share of the mini-batch
    loss, so that accumulating micro-batches (and averaging over ranks, times world size) gives
    the gradient of the whole mini-batch."""
    if loss_agg_mode == "token-mean":
        return tokens / global_tokens if global_tokens else 0.0
    if loss_agg_mode == "token-sum":
        return 1.0
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        return seqs / global_seqs if global_seqs else 0.0
    raise ValueError(f"algorithm.loss_agg_mode={loss_agg_mode!r} is not one the trainer can "
                     "accumulate: token-mean, token-sum, seq-mean-token-sum, "
                     "seq-mean-token-sum-norm, seq-mean-token-mean")
