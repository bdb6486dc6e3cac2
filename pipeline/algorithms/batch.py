"""From a batch of scored samples to the tensors the trainer consumes.

Steps: multi-turn returns per trajectory (written to ``Sample.ret``), group advantages per task,
overlong filtering, dropping of zero-advantage groups and of rows left without loss tokens, then
padded tensors.

Row layout (what ``pipeline.trainer`` reads): ``input_ids [B, P+R]`` holds the prompt
left-padded into the first P columns and the response right-padded into the last R, so every
prompt ends at column P-1 and the logits predicting the response are positions P-1 .. P+R-2.
P and R are the longest prompt and response among the kept rows (R <= max_response_length).
Rows are sorted by (task, trajectory, turn), so a task's samples are contiguous.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pipeline.algorithms.advantages import group_advantages
from pipeline.algorithms.config import check_algorithm_config
from pipeline.algorithms.filters import overlong_loss_mask, zero_advantage_groups
from pipeline.algorithms.returns import multi_turn_returns
from pipeline.sample import Sample

if TYPE_CHECKING:
    from pipeline.algorithms.config import AlgorithmConfig


@dataclass
class TrainBatch:
    input_ids: torch.Tensor          # [B, P+R] long
    attention_mask: torch.Tensor     # [B, P+R] long, 1 on prompt and response tokens
    position_ids: torch.Tensor       # [B, P+R] long, 0.. from the first prompt token
    response_mask: torch.Tensor      # [B, R] float, loss mask
    advantages: torch.Tensor         # [B, R] float, the row's advantage on its loss tokens
    sampler_log_probs: torch.Tensor  # [B, R] float, the sampler's log-probs (0 on padding)
    truncated: torch.Tensor          # [B] bool, response cut at the length limit
    returns: torch.Tensor            # [B] float, multi-turn return R_t
    scores: torch.Tensor             # [B] float, the turn's own score s_t
    group_ids: list[str]             # [B] advantage group of each row: f"{step}/{task_id}"
    uids: list[str]                  # [B] Sample.uid of each row
    prompt_len: int                  # P
    metrics: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_len(self) -> int:   # R
        return int(self.response_mask.shape[1])


def _longs(xs: list[int]) -> torch.Tensor:
    # through numpy: a few times faster than torch.tensor on long Python lists (16K-token responses)
    return torch.from_numpy(np.asarray(xs, dtype=np.int64))


def group_id(s: Sample) -> str:
    """The advantage group of a sample: its task within its batch."""
    return f"{s.step}/{s.task_id}"


def _returns(samples: list[Sample], cfg: AlgorithmConfig) -> int:
    """``s.ret`` for every sample, trajectory by trajectory; returns how many scores were not
    finite (counted as 0: one NaN would otherwise poison its whole group's advantages)."""
    trajs: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        trajs.setdefault((group_id(s), s.traj), []).append(s)
    keys = list(trajs)
    T = max(s.turn for s in samples) + 1
    scores = torch.zeros(len(keys), T, dtype=torch.float64)
    present = torch.zeros(len(keys), T, dtype=torch.bool)
    for i, k in enumerate(keys):
        for s in trajs[k]:
            if present[i, s.turn]:
                raise ValueError(f"two samples for task {s.task_id!r} trajectory {s.traj} turn {s.turn} "
                                 f"(uid {s.uid!r}): a batch holds each turn once")
            scores[i, s.turn] = float(s.score) if math.isfinite(float(s.score)) else 0.0
            present[i, s.turn] = True
    rets = multi_turn_returns(scores, cfg.gamma, cfg.aggregate, present)
    for i, k in enumerate(keys):
        for s in trajs[k]:
            s.ret = float(rets[i, s.turn])
    return sum(1 for s in samples if not math.isfinite(float(s.score)))


def _empty(prompt_len: int = 0) -> dict[str, Any]:
    z2 = torch.zeros(0, prompt_len, dtype=torch.long)
    zf = torch.zeros(0, 0)
    return dict(input_ids=z2, attention_mask=z2.clone(), position_ids=z2.clone(), response_mask=zf,
                advantages=zf.clone(), sampler_log_probs=zf.clone(),
                truncated=torch.zeros(0, dtype=torch.bool), returns=torch.zeros(0),
                scores=torch.zeros(0), group_ids=[], uids=[], prompt_len=prompt_len)


def build_train_batch(samples: list[Sample], cfg: AlgorithmConfig, max_response_length: int,
                      pad_token_id: int) -> TrainBatch:
    """The training rows of one batch, with filter and reward statistics in ``metrics``.

    Generation failures (``finish_reason == "error"`` or no response tokens) keep their score in
    their trajectory's returns but are not trained on. A batch with nothing left to learn from
    comes back with 0 rows (the loop then skips the step).
    """
    check_algorithm_config(cfg)
    if max_response_length < 1:
        raise ValueError(f"max_response_length={max_response_length}: expected >= 1")
    metrics: dict[str, float] = {"batch/samples": float(len(samples))}
    if not samples:
        metrics["batch/rows"] = 0.0
        return TrainBatch(**_empty(), metrics=metrics)
    metrics["batch/nonfinite_scores"] = float(_returns(samples, cfg))
    trainable = [s for s in samples if s.finish_reason != "error" and s.response_ids]
    metrics["batch/gen_errors"] = float(len(samples) - len(trainable))
    rets_all = torch.tensor([s.ret for s in samples])
    metrics["critic/returns/mean"] = float(rets_all.mean())
    metrics["critic/returns/max"] = float(rets_all.max())
    trainable.sort(key=lambda s: (s.step, s.task_id, s.traj, s.turn))
    n = len(trainable)
    if n == 0:
        metrics["batch/rows"] = 0.0
        return TrainBatch(**_empty(), metrics=metrics)

    groups = [group_id(s) for s in trainable]
    returns = torch.tensor([s.ret for s in trainable], dtype=torch.float32)
    scores = torch.tensor([float(s.score) if math.isfinite(float(s.score)) else 0.0 for s in trainable])
    adv = group_advantages(returns, groups, cfg.norm_by_std, cfg.adv_eps)

    clipped = [len(s.response_ids) > max_response_length for s in trainable]
    truncated = torch.tensor([s.truncated or c for s, c in zip(trainable, clipped)], dtype=torch.bool)
    resp_lens = [min(len(s.response_ids), max_response_length) for s in trainable]
    R = max(resp_lens)
    resp_mask = torch.zeros(n, R)
    for i, r in enumerate(resp_lens):
        resp_mask[i, :r] = 1.0
    resp_mask, filtered = overlong_loss_mask(truncated, resp_mask, cfg.overlong_filter, scores)
    adv = torch.where(filtered, torch.zeros_like(adv), adv)
    has_loss = resp_mask.sum(1) > 0

    keep = has_loss.clone()
    n_groups = len(set(groups))
    dropped_groups = dropped_samples = 0
    if cfg.drop_zero_adv_groups:
        zero = zero_advantage_groups(adv, groups, has_loss)
        dropped_groups = len(zero.groups)
        dropped_samples = int((zero.keep.logical_not() & has_loss).sum())
        keep &= zero.keep
    metrics.update({
        "batch/groups": float(n_groups),
        "batch/groups_dropped_zero_adv": float(dropped_groups),
        "batch/samples_dropped_zero_adv": float(dropped_samples),
        "batch/groups_zero_adv_frac": dropped_groups / n_groups,
        "batch/overlong_filtered": float(filtered.sum()),
        "batch/clipped_to_max_length": float(sum(clipped)),
        "batch/adv_abs_mean": float(adv[has_loss].abs().mean()) if has_loss.any() else 0.0,
    })
    rows = [i for i in range(n) if keep[i]]
    metrics["batch/rows"] = float(len(rows))
    if not rows:
        return TrainBatch(**_empty(), metrics=metrics)

    kept = [trainable[i] for i in rows]
    P = max(len(s.prompt_ids) for s in kept)
    R = max(resp_lens[i] for i in rows)
    B = len(rows)
    input_ids = torch.full((B, P + R), pad_token_id, dtype=torch.long)
    attention = torch.zeros(B, P + R, dtype=torch.long)
    sampler_lp = torch.zeros(B, R)
    for b, (i, s) in enumerate(zip(rows, kept)):
        p, r = len(s.prompt_ids), resp_lens[i]
        if len(s.logprobs) < r:
            raise ValueError(f"sample {s.uid!r}: {len(s.logprobs)} sampler log-probs for {r} response "
                             "tokens; the engine must return one log-prob per generated token")
        input_ids[b, P - p:P] = _longs(s.prompt_ids)
        input_ids[b, P:P + r] = _longs(s.response_ids[:r])
        attention[b, P - p:P + r] = 1
        sampler_lp[b, :r] = torch.from_numpy(np.asarray(s.logprobs[:r], dtype=np.float32))
    position_ids = (attention.cumsum(1) - 1).clamp(min=0)
    idx = torch.tensor(rows, dtype=torch.long)
    response_mask = resp_mask[idx, :R]
    advantages = adv[idx].unsqueeze(1) * response_mask
    metrics["batch/loss_tokens"] = float(response_mask.sum())
    metrics["batch/tokens"] = float(attention.sum())
    metrics["batch/pad_frac"] = 1.0 - float(attention.float().mean())
    return TrainBatch(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                      response_mask=response_mask, advantages=advantages, sampler_log_probs=sampler_lp,
                      truncated=truncated[idx], returns=returns[idx], scores=scores[idx],
                      group_ids=[groups[i] for i in rows], uids=[s.uid for s in kept], prompt_len=P,
                      metrics=metrics)


def mean_score(samples: list[Sample]) -> float:
    """The batch's mean score (0 for an empty batch)."""
    return sum(float(x.score) for x in samples) / len(samples) if samples else 0.0


def skip_reason(m: dict[str, float], samples: list[Sample],
                earlier: tuple[int, float] | None = None) -> str:
    """Why a batch left no training rows, from ``build_train_batch``'s metrics. ``earlier``: the
    step and mean score of the run's best batch so far, to tell a policy that never scored from
    one that stopped scoring after updates."""
    n = int(m.get("batch/samples", 0))
    failed = int(m.get("batch/gen_errors", 0))
    if n == 0:
        return "the batch has no samples (all dropped over the staleness bound?)"
    if failed >= n:
        return f"all {n} samples failed to generate (finish_reason error or no tokens)"
    if int(m.get("batch/overlong_filtered", 0)) >= n - failed:
        return (f"all {n - failed} responses were overlong (cut at the response length limit and "
                "masked out by algorithm.overlong_filter)")
    groups = int(m.get("batch/groups", 0))
    mean = mean_score(samples)
    if earlier is not None and earlier[1] > 0 and mean <= 0:
        # seen on the H200 (2026-12-05): a warm-started 0.5B at lr 2e-5 scored 0.54 at step 0,
        # then wrote syntax errors only from step 2, and no step trained again
        return (f"all {groups} groups had zero advantage and every sample scored {mean:.3f}, after "
                f"step {earlier[0]}'s batch had mean score {earlier[1]:.3f}: the policy stopped "
                "solving what it solved, and with no advantage nothing trains it back. The updates "
                "since were likely too large for this model: lower trainer.optim.lr (rollout_corr/kl "
                "of the steps after an update says how far each moved the policy; ~0.005 a step "
                "learns on the laptop, 0.057 broke a 0.5B warm start)")
    return (f"all {groups} groups had zero advantage (every sample of a task scored the same; "
            f"mean score {mean:.3f}): raise rollout.n_trajectories or the "
            "temperature, or start from a model that already solves some tasks (model.warm_start)")
