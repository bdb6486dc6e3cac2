"""A kernel-free ``RewardEnv`` for pipeline tests: a reward a tiny random model learns quickly.

Score of a turn = share of the answer's characters equal to ``target`` (the answer being the
response without its ``<think>...</think>`` reasoning). Multi-turn like the kernel environment:
earlier turns come back as the model's summary + answer followed by feedback that names the
score, never with their reasoning. ``delay_s`` slows every evaluation (for streaming tests).
"""
from __future__ import annotations

import asyncio
import re

from rewards.interface import TaskRef, Turn, TurnOutcome

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_SUMMARY = re.compile(r"^\s*summary:\s*(.*)$", re.IGNORECASE | re.MULTILINE)


def split_response(response: str) -> tuple[str, str, str]:
    """(reasoning, summary, answer): reasoning is dropped from later prompts, the rest kept."""
    reasoning = "".join(m.group(0) for m in _THINK.finditer(response))
    rest = _THINK.sub("", response).strip()
    m = _SUMMARY.search(rest)
    summary = m.group(1).strip() if m else ""
    answer = _SUMMARY.sub("", rest).strip()
    return reasoning, summary, answer


class ToyEnv:
    def __init__(self, target: str = "a", n_tasks: int = 4, n_holdout: int = 2, delay_s: float = 0.0,
                 system_prompt: str = "You are a helpful assistant.") -> None:
        if len(target) != 1:
            raise ValueError(f"ToyEnv target={target!r}: expected one character")
        self.target, self.delay_s, self.system_prompt = target, float(delay_s), system_prompt
        self._splits = {"train": [self._task("train", i) for i in range(n_tasks)],
                        "holdout": [self._task("holdout", i) for i in range(n_holdout)]}
        self.evaluations = 0

    def _task(self, split: str, i: int) -> TaskRef:
        prompt = f"Task {split}-{i}: reply with as many '{self.target}' characters as you can."
        return TaskRef(task_id=f"toy/{split}/{i}", payload={"prompt": prompt})

    def tasks(self, split: str) -> list[TaskRef]:
        if split not in self._splits:
            raise ValueError(f"ToyEnv split={split!r}: expected one of {sorted(self._splits)}")
        return list(self._splits[split])

    def messages(self, task: TaskRef, history: list[Turn]) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": task.payload["prompt"]}]
        for turn in history:
            kept = (f"Summary: {turn.summary}\n" if turn.summary else "") + turn.answer
            msgs.append({"role": "assistant", "content": kept})
            msgs.append({"role": "user", "content": turn.feedback})
        return msgs

    def answer_score(self, answer: str) -> float:
        return answer.count(self.target) / len(answer) if answer else 0.0

    async def score(self, task: TaskRef, response: str) -> TurnOutcome:
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        self.evaluations += 1
        _, summary, answer = split_response(response)
        s = self.answer_score(answer)
        feedback = (f"Your previous answer scored {s:.3f} (share of '{self.target}'). "
                    "Write a better one.")
        return TurnOutcome(score=s, feedback=feedback, summary=summary, answer=answer,
                           parse_ok=bool(answer), compiled=bool(answer), correct=s > 0,
                           error_kind=None if answer else "empty_answer",
                           verdict={"target": self.target, "chars": len(answer)})

    def in_flight(self) -> dict[str, float]:
        return {}  # scored inline: nothing is ever under way apart

    async def aclose(self) -> None:
        return None
