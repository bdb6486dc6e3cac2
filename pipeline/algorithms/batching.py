"""Splitting rows for compute: micro-batches under a token budget (gradient accumulation) and
balanced shares for data-parallel ranks, both on verl's Karmarkar-Karp partitioner."""
from __future__ import annotations

from collections.abc import Sequence

_BALANCED_TRIES = 4


def _first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, load in enumerate(loads):
            if load + lengths[i] <= budget:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return [sorted(b) for b in bins]


def _fits(parts: list[list[int]], lengths: Sequence[int], budget: int) -> bool:
    return all(len(p) == 1 or sum(lengths[i] for i in p) <= budget for p in parts)


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Index lists covering every row once; each list's lengths sum to at most ``token_budget``
    unless it is a single row longer than the budget. As few lists as verl's balanced
    partitioner manages for the budget (else first-fit-decreasing packing), balanced in tokens."""
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    if token_budget < 1:
        raise ValueError(f"algorithm.micro_batch_tokens={token_budget}: expected >= 1")
    n = len(lengths)
    if n == 0:
        return []
    lengths = [int(x) for x in lengths]
    packed = _first_fit_decreasing(lengths, token_budget)
    lower = max(1, -(-sum(min(x, token_budget) for x in lengths) // token_budget))
    # a balanced split with few enough lists usually exists a step or two above the lower bound;
    # past that, the packing is as good and costs nothing more
    for k in range(lower, min(len(packed), lower + _BALANCED_TRIES)):
        parts = get_seqlen_balanced_partitions(lengths, k, equal_size=False)
        if _fits(parts, lengths, token_budget):
            return parts
    return sorted(packed)


def balance_across_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """``world_size`` index lists with near-equal token sums (verl Karmarkar-Karp). With fewer
    rows than ranks, the last ranks get empty lists (the trainer fills them with zero-weight rows)."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: expected >= 1")
    n = len(lengths)
    if n < world_size:
        return [[i] for i in range(n)] + [[] for _ in range(world_size - n)]
    if world_size == 1:
        return [list(range(n))]
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    return get_seqlen_balanced_partitions([int(x) for x in lengths], world_size, equal_size=False)
