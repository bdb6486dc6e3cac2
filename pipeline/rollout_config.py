"""Episode schema (values in conf/rollout/hf.yaml and conf/rollout/vllm.yaml)."""
from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from pipeline.engines.config import EngineConfig


@dataclass
class RolloutConfig:
    n_trajectories: int = MISSING        # parallel trajectories per task (Kevin: 16)
    turns: int = MISSING                 # refinement turns per trajectory (Kevin: 4)
    temperature: float = MISSING
    top_p: float = MISSING
    top_k: int = MISSING                 # -1: off
    max_prompt_length: int = MISSING     # tokens; older turns are dropped from the context first
    max_response_length: int = MISSING   # tokens, from step 0 unless the schedule says otherwise
    # [[from_step, length], ...] ascending: e.g. [[0, 16384], [30, 22528]] (Kevin); [] = constant
    response_length_schedule: list[list[int]] = field(default_factory=lambda: MISSING)
    gen_timeout_s: float = MISSING       # one generation; past it the turn is a score-0 error sample
    score_timeout_s: float = MISSING      # one evaluation, likewise
    stream_buffer: int = MISSING         # finished samples a sampler holds before trajectories wait
    # back pressure: no new generation starts while this many of a worker's answers await their
    # score (the evaluator's backlog); 0: generate regardless (pipeline/rollout.py)
    max_pending_scores: int = MISSING
    engine: EngineConfig = field(default_factory=EngineConfig)


def response_length_at(cfg: RolloutConfig, step: int) -> int:
    """Max response tokens at ``step`` under ``cfg.response_length_schedule``."""
    length = int(cfg.max_response_length)
    last = -1
    for entry in cfg.response_length_schedule or []:
        if len(entry) != 2 or entry[0] <= last or entry[1] < 1:
            raise ValueError(f"rollout.response_length_schedule={list(cfg.response_length_schedule)}: "
                             "expected ascending [from_step, length] pairs with length >= 1")
        last = entry[0]
        if step >= entry[0]:
            length = int(entry[1])
    return length


def max_response_length(cfg: RolloutConfig) -> int:
    """The longest response any step may produce (what the trainer pads to)."""
    return max([int(cfg.max_response_length)] + [int(e[1]) for e in cfg.response_length_schedule or []])


def load_rollout_config(name: str = "hf", overrides: list[str] | None = None) -> RolloutConfig:
    """``conf/rollout/<name>.yaml`` on the schema (for code outside the Hydra entry point)."""
    from pipeline.conf_files import load_group

    return load_group(RolloutConfig, "rollout", name, overrides)
