"""Held-out metrics over k trajectories per task (pure functions; the CLI is pipeline.evaluate).

* pass@k: unbiased estimator of Chen et al. 2021, 1 - C(n-c, k) / C(n, k), per task, averaged.
* best@k / avg@k: the best / mean over a task's k attempts of correctness and of speedup
  (speedup counts only for correct attempts; an incorrect one counts 0).
* fast_p: share of all tasks with an attempt that is correct and faster than p x the reference
  (KernelBench's definition; p = 0 is plain correctness). Over best attempts when k > 1.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k draws without replacement from n attempts (c correct)
    is correct; computed as a stable product."""
    if k > n:
        raise ValueError(f"pass@k needs k <= n attempts (k={k}, n={n})")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def task_table(attempts: Iterable[tuple[str, bool, float | None]]) -> dict[str, list[tuple[bool, float]]]:
    """(task_id, correct, speedup) -> per task list of (correct, speedup-if-correct-else-0)."""
    table: dict[str, list[tuple[bool, float]]] = defaultdict(list)
    for task, correct, speedup in attempts:
        table[task].append((bool(correct), float(speedup or 0.0) if correct else 0.0))
    return dict(table)


def summarize(attempts: Iterable[tuple[str, bool, float | None]], ks: Iterable[int] = (1,),
              fast_ps: Iterable[float] = (0.0, 1.0, 1.5, 2.0)) -> dict[str, float]:
    table = task_table(attempts)
    if not table:
        return {}
    out: dict[str, float] = {}
    n_tasks = len(table)
    for k in ks:
        usable = {t: a for t, a in table.items() if len(a) >= k}
        if not usable:
            continue
        out[f"eval/pass@{k}"] = float(np.mean([pass_at_k(len(a), sum(c for c, _ in a), k)
                                               for a in usable.values()]))
    out["eval/best_correct"] = float(np.mean([max(c for c, _ in a) for a in table.values()]))
    out["eval/avg_correct"] = float(np.mean([np.mean([c for c, _ in a]) for a in table.values()]))
    out["eval/best_speedup"] = float(np.mean([max(s for _, s in a) for a in table.values()]))
    out["eval/avg_speedup"] = float(np.mean([np.mean([s for _, s in a]) for a in table.values()]))
    for p in fast_ps:
        out[f"eval/fast_{p:g}"] = sum(1 for a in table.values()
                                     if any(c and (p == 0 or s > p) for c, s in a)) / n_tasks
    out["eval/tasks"] = float(n_tasks)
    out["eval/attempts_per_task"] = float(np.mean([len(a) for a in table.values()]))
    return out
