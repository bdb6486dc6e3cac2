"""The reward interface: all that ``pipeline/`` knows about kernels when it trains and evaluates.

An environment turns (task, conversation so far) into chat messages, and a model response into a
scored :class:`TurnOutcome` whose feedback feeds the next turn. ``score`` is async so the
rollout side can await many at once while generation continues. The pipeline also takes from here
the environments' config schemas (its root config composes them), the checks of those configs and
the one factory that builds an environment inside a sampler actor, so it imports nothing else of
``rewards/`` or ``sandbox/`` to run one.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rewards.config import RewardConfig, ToyEnvConfig  # env schemas the root config composes
from rewards.scrub import scrub  # the secret scrubber, for text the pipeline writes itself
from sandbox.config import SandboxConfig  # the kernel env's sandbox schema, composed likewise
from sandbox.result import IN_FLIGHT_STAGES  # the stages RewardEnv.in_flight counts, in order

__all__ = ["ENVS", "IN_FLIGHT_STAGES", "SandboxConfig", "RewardConfig", "RewardEnv", "TaskRef", "ToyEnvConfig", "Turn",
           "TurnOutcome", "check_env_config", "env_spec", "evaluation_memory", "kernel_env", "scrub"]

ENVS = ("kernel", "toy")  # the root config's ``env`` key: which RewardEnv the samplers build


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
    verdict: dict[str, Any] = field(default_factory=dict)  # full evaluator record (SandboxResult.to_dict())
    # what the environment wants logged for this turn, by metric name; the pipeline reduces each
    # name over the batch's turns that carry it (pipeline.metrics.env_metrics): a name ending in
    # ``_per_min`` logs the sum per minute of the batch's wall time, ``_p50`` the median, any
    # other the mean
    metrics: dict[str, float] = field(default_factory=dict)
    evaluated: bool = False            # the evaluator ran the answer (so its latency is an evaluation's)


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

    async def score(self, task: TaskRef, response: str) -> TurnOutcome:
        """Parse, check rules, run the sandbox, score. Never raises for bad model output."""

    def in_flight(self) -> dict[str, float]:
        """The evaluations under way by stage (``queued``, ``build``, ``run``), and the oldest one's
        age (``oldest_s``) and stage index (``oldest_stage``); {} where nothing is evaluated apart."""

    async def aclose(self) -> None:
        """Release evaluator processes."""


def env_spec(env: str, reward: RewardConfig, sandbox: SandboxConfig | None, toy: ToyEnvConfig,
             eval_gpus: list[list[int]] | None = None) -> Any:
    """What each sampler actor builds its environment from (``pipeline.sampler_worker.build_env``), for the
    root config's ``env``, ``reward``, ``sandbox`` and ``toy`` groups. ``eval_gpus[i]``: the
    dedicated evaluation GPUs of sampler worker i (None: the sandbox config's own ``gpu_ids``)."""
    if env == "toy":
        return {"_target_": "rewards.toy.ToyEnv", "target": toy.target, "n_tasks": toy.n_tasks,
                "n_holdout": toy.n_holdout, "delay_s": toy.delay_s}
    if env != "kernel":
        raise ValueError(f"env={env!r}: expected one of {ENVS}")
    spec = functools.partial(kernel_env, reward, sandbox, eval_gpus)
    spec.per_worker = True  # type: ignore[attr-defined]  # build_env passes the worker's index
    return spec


def kernel_env(reward: RewardConfig, sandbox: SandboxConfig, eval_gpus: list[list[int]] | None = None,
               worker_index: int = 0) -> RewardEnv:
    """Built inside a sampler actor: the kernel env and its own evaluation pool, timing on worker
    ``worker_index``'s share of the evaluation GPUs when there are any."""
    from omegaconf import OmegaConf

    from rewards.env import KernelEnv

    if eval_gpus:
        sandbox = OmegaConf.merge(sandbox, {"gpu_ids": list(eval_gpus[worker_index])})
    return KernelEnv.from_config(reward, sandbox)


def split_tasks(env: str, reward: RewardConfig, toy: ToyEnvConfig, split: str) -> list[TaskRef]:
    """One split's tasks, read here without a sandbox pool (the task files only), so a command can
    stop on an empty or unknown split before it starts Ray and the model."""
    if env == "kernel":
        from rewards.env import KernelEnv

        return KernelEnv(reward, eval_pool=None).tasks(split)
    from rewards.toy import ToyEnv

    spec = env_spec(env, reward, None, toy)  # the toy env's arguments, or the error naming env
    return ToyEnv(**{k: v for k, v in spec.items() if k != "_target_"}).tasks(split)


def evaluation_memory(reward: RewardConfig, sandbox: SandboxConfig) -> tuple[int, dict[str, int | None]]:
    """The smallest visible GPU's memory in bytes (0: none visible here, nothing to check) and, by
    task id, the bytes one GPU evaluation of each of the run's tasks (both splits) may hold at once
    (the sandbox's admission estimate, ``rewards.env.evaluation_bytes``; None: measured only when it
    runs), so a run whose evaluations share a GPU with its engine and trainer can be checked against
    ``sandbox.gpu_memory_share`` before the model loads."""
    from rewards.env import KernelEnv, evaluation_bytes
    from sandbox.footprint import device_memory_bytes

    memory = device_memory_bytes()
    if not memory:
        return 0, {}
    env = KernelEnv(reward, eval_pool=None)
    tasks = [ref.payload for split in ("train", "holdout") for ref in env.tasks(split)]
    return min(memory), evaluation_bytes(tasks, sandbox)


def check_env_config(env: str, reward: RewardConfig) -> None:
    """The semantic checks of the chosen environment's config (ValueError naming the key)."""
    if env not in ENVS:
        raise ValueError(f"env={env!r}: expected one of {ENVS}")
    if env == "kernel":
        from rewards.config import validate

        validate(reward)
