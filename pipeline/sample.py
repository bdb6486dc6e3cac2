"""One training sample = one turn of one trajectory, as the sampler hands it to the trainer."""
from __future__ import annotations

from dataclasses import dataclass

from rewards.interface import TurnOutcome


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
    # the environment's scored turn (verdict, hacks, ...); a turn the environment never scored
    # (generation or evaluation failed) carries one with error_kind "pipeline_error"; None only
    # where a caller built the Sample without one
    outcome: TurnOutcome | None = None
    error: str | None = None          # generation/evaluation failure reason, if any
    history_dropped: int = 0          # oldest turns left out of this turn's prompt to fit it
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
