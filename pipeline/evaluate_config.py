"""Schema of held-out evaluation (values in conf/evaluate/default.yaml), apart from
pipeline/evaluate.py so the root config composes it without importing the evaluation entry point."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass
class BeamConfig:
    width: int = MISSING            # trajectories per task in every round (Kevin: 16)
    keep: int = MISSING             # best trajectories kept after a round (Kevin: 4)
    turns_per_round: int = MISSING  # turns between two selections (Kevin: 4)
    rounds: int = MISSING           # the budget: rounds x turns_per_round turns


@dataclass
class EvaluateConfig:
    checkpoint: str | None = MISSING   # a checkpoint dir (its model/ is loaded); null: model.*
    split: str = MISSING               # the env split to evaluate on
    k: int = MISSING                   # trajectories per task
    ks: list[int] = field(default_factory=lambda: MISSING)  # pass@k for each k <= evaluate.k
    fast_ps: list[float] = field(default_factory=lambda: MISSING)
    max_tasks: int = MISSING           # 0: all tasks of the split
    temperature: float | None = MISSING  # null: rollout.temperature
    search: str = MISSING              # none: k trajectories of rollout.turns; beam: pipeline.beam
    beam: BeamConfig = field(default_factory=BeamConfig)
    compare: Optional[str] = MISSING     # a second checkpoint evaluated the same way, printed beside


SEARCHES = ("none", "beam")
