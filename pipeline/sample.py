"""One training sample = one turn of one trajectory, as the sampler hands it to the trainer."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    uid: str                          # f"{step}/{task_id}/{traj}/{turn}": unique within a run
    step: int                         # batch index this sample belongs to
    task_id: str
    traj: int                         # trajectory index within the task's group
    turn: int                         # 0-based turn index
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]             # sampler's per-token log-probs of response_ids
    finish_reason: str                # "stop" | "length" | "error"
    score: float                      # per-turn score s_t
    policy_version: int               # weights version that generated it
    response_text: str = ""
    outcome: dict[str, Any] = field(default_factory=dict)  # TurnOutcome fields (verdict, hacks, ...)
    error: str | None = None          # generation/evaluation failure reason, if any
    # timestamps (time.time()): generation start/end, evaluation end
    t_gen_start: float = 0.0
    t_gen_end: float = 0.0
    t_eval_end: float = 0.0
    ret: float | None = None          # multi-turn return R_t, filled by the algorithm
    # test-time search (pipeline.beam): the round this turn was generated in, and the trajectory
    # of the previous round whose history it continued (None: it started fresh). 0/None in training.
    round: int = 0
    parent: int | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"
