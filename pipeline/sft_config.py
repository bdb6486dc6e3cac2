"""Schema of the supervised warm start (values in conf/sft/default.yaml), apart from
pipeline/sft.py so that the root config composes it without importing the entry point."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass
class SftConfig:
    data: str = MISSING                 # corpus (the built-in answer corpus) | <path of a JSONL file>
    variants: list[str] = field(default_factory=lambda: MISSING)   # corpus variants; []: all
    # corpus variant -> copies of its conversations (absent: 1): sets the share of each variant the
    # warm-started policy writes, e.g. more wrong/broken than fast leaves RL room to raise the reward
    variant_weights: dict[str, int] = field(default_factory=lambda: MISSING)
    task_ids: list[str] = field(default_factory=lambda: MISSING)   # corpus tasks; []: the train split's
    epochs: int = MISSING               # passes over the conversations
    batch_size: int = MISSING           # conversations per optimiser step
    max_response_length: int = MISSING  # an answer over this many tokens is an error, not cut
    stop_loss: float = MISSING          # > 0: stop once a step's loss is at most this (0: all epochs)
    output_dir: Optional[str] = MISSING  # null: <run dir>/final (the HF model is its model/)
    seed: int = MISSING
