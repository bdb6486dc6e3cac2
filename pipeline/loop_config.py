"""The step loop's schema (values in conf/pipeline/default.yaml), apart from the loop so that
``pipeline/config.py`` composes it without importing the loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING


@dataclass
class PipelineConfig:
    mode: Optional[str] = MISSING    # sync (= max_staleness 0) | one_off (= 1) | null: max_staleness
    max_staleness: int = MISSING     # k: batches generated up to k weights versions ahead
    staleness_policy: str = MISSING  # drop | wait: a trajectory found over the bound at train time
    partial_rollout: bool = MISSING  # a push may reach the samplers while a batch is generated
    steps: int = MISSING             # training steps (batches trained)
    tasks_per_batch: int = MISSING   # Kevin: 8
    task_split: str = MISSING        # the env split to train on
    shuffle_tasks: bool = MISSING    # new task order each pass over the split (seeded)
    weight_push: str = MISSING       # auto | object_store | cuda_ipc | broadcast
    weight_push_timeout_s: float = MISSING  # forming the broadcast group, at most
    initial_weight_push: bool = MISSING  # push the trainer's weights before the first batch
    verify_weight_push: bool = MISSING   # compare per-tensor checksums of engine and trainer after each push
    progress: bool = MISSING         # progress bars on generation / training
    heartbeat_s: float = MISSING     # bars off: a line on each part's work after this long without one (0: never)
    seed: int = MISSING
    max_trainer_restarts: int = MISSING  # a lost trainer group restarted in the run from the latest
                                     # checkpoint at most this many times (AReaL: recover.retries)
