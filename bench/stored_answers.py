"""A kernel env whose evaluator gets work while the policy is a random model (bench/pipeline.py).

A random-initialised model never writes an answer that parses, so with the real ``KernelEnv``
every score would come back in microseconds (a parse error), every group would have zero
advantage and the evaluator would never compile or time a kernel: the pipeline would be measured
without the reward phase it exists to overlap. This wrapper keeps everything real (the policy
generates its full responses, which are what the trainer trains on; the sandbox compiles, checks
and times on the GPU) and changes one thing: the text the evaluator scores is a known-correct answer
of the task from ``rewards/solutions/<backend>/`` instead of the model's. Only tasks with such an
answer are dealt. ``share`` (0 < share <= 1) is the share of evaluations given the stored answer,
spread evenly over the calls (the others score the model's own text: a parse error, at once); it
sets how much evaluator work a batch brings. ``variants`` > 1 changes a comment in the answer's
C++/CUDA source from call to call, so that many distinct builds exist per task (the build cache
then compiles each once, as it would distinct candidates); 1 lets every evaluation after the
first build hit the cache. ``tasks`` > 0 keeps only the first that many answered tasks (sorted by
id): with ``pipeline.tasks_per_batch`` equal to it, every step scores the same tasks, so after the
first step every build is a cache hit and the reward phase is the evaluations' GPU work alone.

Written here because nothing outside the project can stand in for its own answer files.
"""
from __future__ import annotations

import functools
import math
from typing import Any

from rewards.interface import TaskRef, Turn, TurnOutcome
from rewards.solutions import available, load_solution

_INCLUDE = "#include <torch/extension.h>"


def answer_text(code: str, variant: int) -> str:
    """The stored answer in the format the parser expects (a summary, one python block)."""
    if variant and _INCLUDE in code:
        code = code.replace(_INCLUDE, f"{_INCLUDE}\n// bench variant {variant}", 1)
    return f"Summary: the stored reference answer (bench variant {variant}).\n\n```python\n{code}\n```\n"


class StoredAnswerEnv:
    """The RewardEnv protocol over a KernelEnv (``inner``), scoring stored answers."""

    def __init__(self, inner: Any, share: float = 1.0, variants: int = 1, tasks: int = 0) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"--answer-share={share}: expected 0 < share <= 1")
        self.inner, self.share, self.variants = inner, float(share), max(1, int(variants))
        have = set(available(inner.backend))
        every = [r for split in ("train", "holdout") for r in inner.tasks(split)]
        self._tasks = sorted((r for r in every if r.task_id in have), key=lambda r: r.task_id)
        if tasks > 0:
            self._tasks = self._tasks[:tasks]
        if not self._tasks:
            raise ValueError(f"no task of this env has a stored {inner.backend} answer "
                             f"(rewards/solutions/{inner.backend}/: {sorted(have)})")
        self._code = {r.task_id: load_solution(inner.backend, r.task_id) for r in self._tasks}
        self._calls = 0

    def tasks(self, split: str) -> list[TaskRef]:
        # every answered task in both splits: the bench measures time, not generalisation
        return list(self._tasks)

    def messages(self, task: TaskRef, history: list[Turn]) -> list[dict[str, str]]:
        return self.inner.messages(task, history)

    def stored(self, call: int) -> bool:
        """Whether the ``call``-th evaluation (1-based) scores the stored answer: floor(call x share)
        steps up, so exactly that share of every run of calls does."""
        return math.floor(call * self.share) > math.floor((call - 1) * self.share)

    async def score(self, task: TaskRef, response: str) -> TurnOutcome:
        self._calls += 1
        if not self.stored(self._calls):
            return await self.inner.score(task, response)
        variant = self._calls % self.variants if self.variants > 1 else 0
        return await self.inner.score(task, answer_text(self._code[task.task_id], variant))

    async def aclose(self) -> None:
        await self.inner.aclose()


def _worker_env(reward_cfg: Any, sandbox_cfg: Any, eval_gpus: Any, share: float, variants: int, tasks: int,
                worker_index: int) -> StoredAnswerEnv:
    from rewards.interface import kernel_env

    return StoredAnswerEnv(kernel_env(reward_cfg, sandbox_cfg, eval_gpus, worker_index), share, variants, tasks)


def env_factory(share: float = 1.0, variants: int = 1, tasks: int = 0) -> Any:
    """For ``pipeline.main.Session(env_factory=...)``: each sampler worker builds its own."""

    def factory(cfg: Any, eval_gpus: Any) -> Any:
        if cfg.env != "kernel":
            raise ValueError(f"--stored-answers needs env=kernel (this config has env={cfg.env})")
        answered = len(available(cfg.reward.backend))
        if tasks > 0:
            answered = min(answered, tasks)
        if cfg.pipeline.tasks_per_batch > answered:  # a task twice in a batch would repeat sample uids
            raise ValueError(f"--stored-answers: pipeline.tasks_per_batch={cfg.pipeline.tasks_per_batch} "
                             f"but only {answered} tasks have a stored {cfg.reward.backend} answer"
                           f"{' (--answer-tasks)' if tasks > 0 else ''}")
        spec = functools.partial(_worker_env, cfg.reward, cfg.sandbox, eval_gpus, share, variants, tasks)
        spec.per_worker = True  # type: ignore[attr-defined]  # build_env passes the worker index
        return spec

    return factory
