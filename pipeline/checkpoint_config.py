"""Schema of checkpointing (values in conf/checkpoint/default.yaml); pipeline/checkpoint.py
writes and reads the checkpoints."""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING


@dataclass
class CheckpointConfig:
    every: int = MISSING        # save every k training steps (0: only at the end)
    keep_last: int = MISSING    # how many to keep (0: all)
    dir: str = MISSING          # under the run dir
    at_end: bool = MISSING      # also save after the last step
