"""GRPO+ for multi-turn episodes: returns, group advantages, filters, the policy loss and the
training batch, as functions on tensors and ``Sample`` lists (no Ray, engines or kernels)."""
from pipeline.algorithms.advantages import group_advantages
from pipeline.algorithms.batch import TrainBatch, build_train_batch, group_id, mean_score, skip_reason
from pipeline.algorithms.batching import balance_across_ranks, micro_batches
from pipeline.algorithms.config import AlgorithmConfig, check_algorithm_config
from pipeline.algorithms.filters import ZeroAdvantageGroups, overlong_loss_mask, zero_advantage_groups
from pipeline.algorithms.health import reasoning_starts_with, rollout_metrics
from pipeline.algorithms.losses import clip_fractions, policy_loss, sft_loss, tis_weights
from pipeline.algorithms.packing import PackedRows, pack
from pipeline.algorithms.returns import multi_turn_returns

__all__ = [
    "AlgorithmConfig", "PackedRows", "TrainBatch", "ZeroAdvantageGroups", "balance_across_ranks", "build_train_batch",
    "check_algorithm_config", "clip_fractions", "group_advantages", "group_id", "mean_score", "micro_batches",
    "multi_turn_returns", "overlong_loss_mask", "pack", "policy_loss", "reasoning_starts_with",
    "rollout_metrics", "sft_loss", "skip_reason", "tis_weights", "zero_advantage_groups",
]
