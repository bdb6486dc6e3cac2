"""The supervised step of a :class:`~pipeline.trainer.worker.TrainerWorker`: the same model,
optimiser, micro-batch plan and row layout as the RL step, with the SFT loss
(``pipeline.algorithms.sft_loss``: mean NLL of the assistant tokens) in place of the policy loss.

Rows are ``TrainBatch`` rows whose ``response_mask`` marks the assistant answer; ``advantages`` and
``sampler_log_probs`` travel but are unused. The worker must be built with temperature 1: log-probs
are of ``logits / temperature``.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from pipeline.trainer.plan import RankPlan, micro_weight


def sft_step(worker: Any, shard: dict[str, torch.Tensor], plan: RankPlan,
             global_tokens: list[int]) -> dict[str, float]:
    from pipeline.algorithms import sft_loss
    from pipeline.trainer.worker import BATCH_KEYS

    t0 = time.perf_counter()
    filler = torch.tensor(plan.filler, dtype=torch.bool)
    shard = dict(shard)
    shard["response_mask"] = shard["response_mask"] * (~filler).unsqueeze(1).to(shard["response_mask"].dtype)
    sums: dict[str, float] = {}
    grad_norms: list[float] = []
    tokens = 0
    for m, mini in enumerate(plan.mini_batches):
        for pos in mini:
            idx = torch.tensor(pos)
            mb, logp, _ = worker._log_probs({k: shard[k][idx] for k in BATCH_KEYS}, False)
            mask = mb["response_mask"].to(worker.device).float()
            toks = int(mask.sum())
            tokens += int(mb["attention_mask"].sum())
            if toks == 0:  # filler: keep the collectives in step, contribute nothing
                (logp.sum() * 0.0).backward()
                continue
            loss, metrics = sft_loss(logp, mask)
            w = micro_weight("token-mean", 0, toks, 0, global_tokens[m])
            (loss * (w * worker.world_size)).backward()  # FSDP averages over ranks
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v * w / len(plan.mini_batches)
        grad_norms.append(worker.optimizer_step())
    keys = sorted(sums)
    vec = torch.tensor([sums[k] for k in keys] + [float(tokens)], dtype=torch.float64)
    if worker.world_size > 1:
        dev = vec.to(worker.device)
        dist.all_reduce(dev)
        vec = dev.cpu()
    out = {k: float(vec[i]) for i, k in enumerate(keys)}
    out["actor/grad_norm"] = sum(grad_norms) / len(grad_norms)
    out["actor/lr"] = float(worker.scheduler.get_last_lr()[0])
    out["actor/optim_steps"] = float(worker.optim_steps)
    out["actor/tokens"] = float(vec[-1])
    out["actor/rank_time_s"] = time.perf_counter() - t0
    return out
