"""The reward interface: the only thing ``pipeline/`` knows about kernels.

An environment turns (task, conversation so far) into chat messages, and a model response into a
scored :class:`TurnOutcome` whose feedback feeds the next turn. ``evaluate`` is async so the
rollout side can await many at once while generation continues.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class TaskRef:
    """What the pipeline needs to know of a task: an id to group by and an opaque payload."""

    task_id: str
    payload: Any = None  # environment-specific (e.g. rewards.tasks.Task); opaque to the pipeline


@dataclass
class TurnOutcome:
    """One scored turn."""

    score: float                       # per-turn score s_t (0 on any failure or rule violation)
    feedback: str                      # message that opens the next turn
    summary: str = ""                  # the model's own short summary, kept in later turns
    answer: str = ""                   # the extracted code block, kept in later turns
    parse_ok: bool = False
    compiled: bool = False
    correct: bool = False
    speedup: float | None = None
    hacks: list[str] = field(default_factory=list)   # names of rules the answer broke
    error_kind: str | None = None      # parse/rule/evaluator error class, None when correct
    verdict: dict[str, Any] = field(default_factory=dict)  # full evaluator record (EvalResult.to_dict())


@dataclass
class Turn:
    """A finished turn as later prompts see it: reasoning is dropped, summary/answer/feedback kept."""

    summary: str
    answer: str
    feedback: str


@runtime_checkable
class RewardEnv(Protocol):
    """Implemented by rewards.env.KernelEnv (real kernels) and rewards.toy.ToyEnv (tests)."""

    def tasks(self, split: str) -> list[TaskRef]:
        """Tasks of a split ("train" or "holdout"), in a fixed order."""

    def messages(self, task: TaskRef, history: list[Turn]) -> list[dict[str, str]]:
        """Chat messages for the next turn given the finished turns of this trajectory."""

    async def evaluate(self, task: TaskRef, response: str) -> TurnOutcome:
        """Parse, check rules, run the sandbox, score. Never raises for bad model output."""

    async def aclose(self) -> None:
        """Release evaluator processes."""
