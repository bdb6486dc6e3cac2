"""Schema of the logger (values in conf/logger/*.yaml); pipeline/metrics.py writes the metrics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass
class LoggerConfig:
    backends: list[str] = field(default_factory=lambda: MISSING)  # console | jsonl | wandb
    # project, entity, group, tags, name, dir: W&B's own environment variables where the config
    # leaves them default (conf/logger/wandb.yaml: ${oc.env:WANDB_PROJECT,kernel-rl}, ...)
    project: str = MISSING
    entity: str | None = MISSING
    group: str | None = MISSING
    tags: list[str] = field(default_factory=lambda: MISSING)
    # auto (WANDB_MODE, else online with WANDB_API_KEY or a stored `wandb login`, else offline)
    # | online | offline | disabled
    mode: str = MISSING
    table_every: int = MISSING       # episode table every k steps (0: never)
    table_rows: int = MISSING
    timeline_every: int = MISSING    # timeline image every k steps (0: only at the end)
    samples: bool = MISSING          # samples.jsonl: every scored turn's task, score and verdict (with the jsonl backend)
    console_keys: list[str] = field(default_factory=lambda: MISSING)
    name: Optional[str] = MISSING    # the W&B run's name (null: the run's name, a sweep job's overrides)
    dir: Optional[str] = MISSING     # where W&B keeps its files (null: the run dir)
