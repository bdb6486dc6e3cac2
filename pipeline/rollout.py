"""The multi-turn episode driver: every trajectory is its own coroutine; every turn is a Sample.

For each task, ``n_trajectories`` x ``turns``: messages = ``env.messages(task, history)`` ->
chat template -> ``engine.generate`` -> ``await env.score(task, text)`` -> history gets
``Turn(summary, answer, feedback)`` (the reasoning is dropped) -> next turn. While one
trajectory waits for its evaluation, all others keep generating; each scored turn is handed to
``on_sample`` at once (streaming rewards).

Back pressure: with ``rollout.max_pending_scores`` = L > 0, a trajectory about to generate waits
while L of the batch's answers are being evaluated (built, checked, timed). In the real regime
every answer is a new build and the evaluator, not the engine, sets the step time; generating
further ahead of it only lengthens its queue (and the reward tail) while holding the sampler GPU.
Generations already running finish; so at most L + the requests in flight are ever pending.

Failures never stop a batch: a failed or timed-out generation or evaluation becomes a score-0
Sample with ``error`` set and ends that trajectory. A prompt longer than ``max_prompt_length``
loses its oldest turns first; if the task prompt alone is too long the trajectory ends, counted in
``BatchStats.ended_prompt_too_long`` (no sample: nothing was generated).

A trajectory may continue an earlier one (test-time search, ``pipeline.beam``): ``starts`` maps
``(task_id, traj)`` to a :class:`Start` whose history opens its prompts and whose turn ids go on
from ``first_turn``; its Samples carry the Start's ``round`` and ``parent``.

API::

    batch = await run_episodes(engine, tokenizer, env, tasks, step, version, cfg, on_sample=cb)
    batch.samples, batch.stats.metrics()
    async for sample in stream_episodes(engine, tokenizer, env, tasks, step, version, cfg): ...
    async for samples in stream_episode_chunks(...): ...   # all scored by then, one item
    await run_episodes(..., starts={(task_id, 0): Start(history, first_turn=4, round=1, parent=2)})
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

from pipeline.engines.base import Engine, Generation, SamplingParams
from pipeline.rollout_config import RolloutConfig, response_length_at
from pipeline.sample import Sample
from rewards.interface import RewardEnv, TaskRef, Turn, TurnOutcome, scrub

OnSample = Callable[[Sample], "Awaitable[None] | None"]


@dataclass
class BatchStats:
    step: int = 0
    n_tasks: int = 0
    n_trajectories: int = 0
    n_generated: int = 0                 # generations returned (failed ones too): scored + being evaluated
    n_samples: int = 0
    n_errors: int = 0                    # samples with ``error`` set
    n_truncated: int = 0                 # responses cut at the length limit
    ended_prompt_too_long: int = 0       # trajectories ended before a turn: task prompt too long
    history_turns_dropped: int = 0       # old turns left out of prompts to fit max_prompt_length
    response_tokens: int = 0
    t_start: float = 0.0
    t_last_gen_end: float = 0.0          # last generated token of the batch
    t_first_score: float = 0.0
    t_last_score: float = 0.0
    engine_steps: float = 0.0            # the engine's steps (vLLM) or generate calls (HF) in this batch
    engine_busy_s: float = 0.0           # seconds inside them: step time tells a slower engine from a starved one
    pending_scores_max: int = 0            # most answers awaiting their score at once (the evaluator's backlog)
    pending_scores_at_gen_end: int = 0     # answers awaiting their score when the batch's last token came:
                                         # the reward tail is the time to drain these
    gen_throttled_s: float = 0.0         # trajectory-seconds spent waiting for the backlog (max_pending_scores)
    latencies_s: list[float] = field(default_factory=list)   # per sample: gen start -> score
    failures: list[str] = field(default_factory=list)        # trajectory-level errors (first 20)

    @property
    def gen_s(self) -> float:
        return max(0.0, self.t_last_gen_end - self.t_start) if self.t_last_gen_end else 0.0

    @property
    def reward_tail_s(self) -> float:
        """Last generated token of the batch -> its last score."""
        return max(0.0, self.t_last_score - self.t_last_gen_end) if self.t_last_score else 0.0

    def metrics(self) -> dict[str, float]:
        lat = self.latencies_s or [0.0]
        return {
            "timing_s/gen": self.gen_s,
            "timing_s/reward": self.reward_tail_s,
            "rollout/samples": float(self.n_samples),
            "rollout/errors": float(self.n_errors),
            "rollout/prompt_too_long": float(self.ended_prompt_too_long),
            "rollout/history_turns_dropped": float(self.history_turns_dropped),
            "rollout/latency_p50_s": statistics.median(lat),
            "rollout/latency_max_s": max(lat),
            "response_length/clip_ratio": self.n_truncated / self.n_samples if self.n_samples else 0.0,
            "response_length/mean": self.response_tokens / self.n_samples if self.n_samples else 0.0,
            "perf/gen_tokens_per_s": self.response_tokens / self.gen_s if self.gen_s else 0.0,
            "perf/engine_steps": self.engine_steps,
            "perf/engine_step_ms": 1e3 * self.engine_busy_s / self.engine_steps if self.engine_steps else 0.0,
            "rollout/pending_scores_max": float(self.pending_scores_max),
            "rollout/pending_scores_at_gen_end": float(self.pending_scores_at_gen_end),
            "rollout/gen_throttled_s": self.gen_throttled_s,
        }

    def merge(self, other: "BatchStats") -> "BatchStats":
        """Stats of two disjoint parts of one batch (e.g. two sampler workers)."""
        if not self.t_start:
            return dataclasses.replace(other, latencies_s=list(other.latencies_s),
                                       failures=list(other.failures))
        out = dataclasses.replace(self, latencies_s=self.latencies_s + other.latencies_s,
                                  failures=(self.failures + other.failures)[:20])
        for name in ("n_tasks", "n_trajectories", "n_generated", "n_samples", "n_errors", "n_truncated",
                     "ended_prompt_too_long", "history_turns_dropped", "response_tokens",
                     "engine_steps", "engine_busy_s", "gen_throttled_s"):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        # each worker has its own evaluator backlog; the batch's worst one is what a reader acts on
        out.pending_scores_max = max(self.pending_scores_max, other.pending_scores_max)
        if other.t_last_gen_end > self.t_last_gen_end:
            out.pending_scores_at_gen_end = other.pending_scores_at_gen_end
        out.t_start = min(self.t_start, other.t_start)
        out.t_last_gen_end = max(self.t_last_gen_end, other.t_last_gen_end)
        out.t_last_score = max(self.t_last_score, other.t_last_score)
        firsts = [t for t in (self.t_first_score, other.t_first_score) if t]
        out.t_first_score = min(firsts) if firsts else 0.0
        return out


@dataclass
class Start:
    """Where a trajectory begins: after ``history`` (finished turns of the trajectory it continues),
    with turn ids from ``first_turn`` (default ``len(history)``); ``round`` and ``parent`` are
    copied onto its Samples."""

    history: list[Turn] = field(default_factory=list)
    first_turn: int | None = None
    round: int = 0
    parent: int | None = None

    @property
    def turn0(self) -> int:
        return len(self.history) if self.first_turn is None else self.first_turn


Starts = Mapping[tuple[str, int], Start]  # (task_id, traj) -> Start; absent: a fresh trajectory


def turn_of(sample: Sample) -> Turn:
    """The finished turn as later prompts see it (the reasoning is dropped)."""
    o = sample.outcome
    return Turn("", "", "") if o is None else Turn(summary=o.summary, answer=o.answer, feedback=o.feedback)


def unscored() -> TurnOutcome:
    """The outcome of a turn the environment never scored (its generation or evaluation failed:
    ``Sample.error`` says why), so the batch's error metrics count it as ``pipeline_error``."""
    return TurnOutcome(score=0.0, feedback="", error_kind="pipeline_error")


@dataclass
class EpisodeBatch:
    samples: list[Sample]
    stats: BatchStats


def build_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def fit_prompt(tokenizer: Any, env: RewardEnv, task: TaskRef, history: list[Turn],
               max_len: int, memo: dict[Any, list[int]] | None = None) -> tuple[list[int] | None, int]:
    """(prompt ids, turns dropped): the oldest turns go first; None if even no history is too long.
    ``memo`` (messages -> ids, one batch's) templates and tokenizes each distinct prompt once: a
    task's first turn is the same prompt for all its trajectories."""
    for dropped in range(len(history) + 1):
        messages = env.messages(task, history[dropped:])
        if memo is None:
            ids = build_prompt(tokenizer, messages)
        else:
            key = tuple(tuple(sorted(m.items())) for m in messages)
            if key not in memo:
                memo[key] = build_prompt(tokenizer, messages)
            ids = list(memo[key])  # each Sample owns its list
        if len(ids) <= max_len:
            return ids, dropped
    return None, len(history)


class EvalBacklog:
    """The batch's answers awaiting their score, and the gate generation waits at (back pressure).

    Counted here, in the rollout, rather than asked of the evaluator: the rollout sees every answer
    it handed over and every score that came back, whatever evaluator sits behind ``RewardEnv``."""

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)              # <= 0: never wait
        self.pending = 0
        self._changed = asyncio.Condition()

    async def wait_for_room(self) -> float:
        """Seconds this caller waited until fewer than ``limit`` answers were pending."""
        if self.limit <= 0 or self.pending < self.limit:
            return 0.0
        t0 = time.monotonic()
        async with self._changed:
            await self._changed.wait_for(lambda: self.pending < self.limit)
        return time.monotonic() - t0

    def add(self) -> int:
        self.pending += 1
        return self.pending

    async def remove(self) -> None:
        self.pending -= 1
        async with self._changed:
            self._changed.notify_all()


class _Episodes:
    def __init__(self, engine: Engine, tokenizer: Any, env: RewardEnv, step: int, version: int,
                 cfg: RolloutConfig, on_sample: OnSample | None, stats: BatchStats) -> None:
        self.engine, self.tokenizer, self.env = engine, tokenizer, env
        self.step, self.version, self.cfg, self.on_sample = step, version, cfg, on_sample
        self.stats = stats
        self.backlog = EvalBacklog(cfg.max_pending_scores)
        self.samples: list[Sample] = []
        # the batch's prompts by their messages: n trajectories of a task start from one prompt, and
        # templating + tokenizing it n times on the event loop delays every request behind it
        # (vLLM's first steps then run with the few requests that came first)
        self.prompts: dict[Any, list[int]] = {}
        self.params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                     max_tokens=response_length_at(cfg, step))

    async def trajectory(self, task: TaskRef, traj: int, start: Start | None = None) -> None:
        start = start if start is not None else Start()
        history: list[Turn] = list(start.history)
        try:
            for turn in range(start.turn0, start.turn0 + self.cfg.turns):
                prompt_ids, dropped = fit_prompt(self.tokenizer, self.env, task, history,
                                                 self.cfg.max_prompt_length, self.prompts)
                if prompt_ids is None:
                    self.stats.ended_prompt_too_long += 1
                    return
                self.stats.history_turns_dropped += dropped
                sample = await self.turn(task, traj, turn, prompt_ids, dropped, start)
                if sample is None:
                    return
                history.append(turn_of(sample))
        except Exception as e:  # an environment bug ends this trajectory, not the batch
            if len(self.stats.failures) < 20:
                self.stats.failures.append(f"{task.task_id}/{traj}: {type(e).__name__}: {e}")

    async def turn(self, task: TaskRef, traj: int, turn: int, prompt_ids: list[int],
                   dropped: int, start: Start) -> Sample | None:
        """One generation + evaluation; returns the Sample, or None when the trajectory ends."""
        self.stats.gen_throttled_s += await self.backlog.wait_for_room()
        t_gen_start = time.time()
        try:
            gen = await asyncio.wait_for(self.engine.generate(prompt_ids, self.params),
                                         self.cfg.gen_timeout_s)
        except asyncio.TimeoutError:
            gen = Generation.failed(f"generation timed out after {self.cfg.gen_timeout_s}s")
        except Exception as e:
            gen = Generation.failed(f"generation failed: {type(e).__name__}: {e}")
        t_gen_end = time.time()
        self.stats.n_generated += 1
        if t_gen_end >= self.stats.t_last_gen_end:
            self.stats.t_last_gen_end = t_gen_end
            # this answer is about to be handed over too: count it among those the tail drains
            self.stats.pending_scores_at_gen_end = self.backlog.pending + (gen.finish_reason != "error")
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True) if gen.token_ids else ""
        error = gen.error if gen.finish_reason == "error" else None
        outcome: TurnOutcome | None = None
        if error is None:
            self.stats.pending_scores_max = max(self.stats.pending_scores_max, self.backlog.add())
            try:
                outcome = await asyncio.wait_for(self.env.score(task, text), self.cfg.score_timeout_s)
            except asyncio.TimeoutError:
                error = f"evaluation timed out after {self.cfg.score_timeout_s}s"
            except Exception as e:  # the environment scrubs what it returns; an exception is not that
                error = scrub(f"evaluation failed: {type(e).__name__}: {e}")
            finally:
                await self.backlog.remove()
        sample = Sample(
            uid=f"{self.step}/{task.task_id}/{traj}/{turn}", step=self.step, task_id=task.task_id,
            traj=traj, turn=turn, prompt_ids=prompt_ids, response_ids=list(gen.token_ids),
            logprobs=list(gen.logprobs), finish_reason=gen.finish_reason,
            score=float(outcome.score) if outcome is not None else 0.0,
            policy_version=gen.version if gen.version >= 0 else self.version,
            response_text=text,
            outcome=outcome if outcome is not None else unscored(),
            error=error, history_dropped=dropped, t_gen_start=t_gen_start, t_gen_end=t_gen_end,
            t_eval_end=time.time(), round=start.round, parent=start.parent)
        await self.deliver(sample)
        return sample if error is None else None

    async def deliver(self, sample: Sample) -> None:
        s = self.stats
        s.n_samples += 1
        s.n_errors += sample.error is not None
        s.n_truncated += sample.truncated
        s.response_tokens += len(sample.response_ids)
        s.t_first_score = s.t_first_score or sample.t_eval_end
        s.t_last_score = max(s.t_last_score, sample.t_eval_end)
        s.latencies_s.append(sample.t_eval_end - sample.t_gen_start)
        self.samples.append(sample)
        if self.on_sample is not None:
            result = self.on_sample(sample)
            if inspect.isawaitable(result):
                await result  # a bounded consumer makes this trajectory wait: backpressure


async def run_episodes(engine: Engine, tokenizer: Any, env: RewardEnv, tasks: list[TaskRef],
                       step: int, version: int, cfg: RolloutConfig,
                       on_sample: OnSample | None = None,
                       stats: BatchStats | None = None,
                       starts: Starts | None = None) -> EpisodeBatch:
    """Run one batch: ``cfg.n_trajectories`` trajectories of ``cfg.turns`` turns per task, each
    from its entry in ``starts`` if it has one."""
    starts = starts or {}
    keys = {(task.task_id, traj) for task in tasks for traj in range(cfg.n_trajectories)}
    unknown = sorted(set(starts) - keys)
    if unknown:
        raise ValueError(f"starts for trajectories not in this batch: {unknown[:5]} (expected "
                         f"(task_id, traj) of the given tasks, traj < {cfg.n_trajectories})")
    stats = stats if stats is not None else BatchStats()
    stats.step, stats.t_start = step, time.time()
    stats.n_tasks, stats.n_trajectories = len(tasks), len(tasks) * cfg.n_trajectories
    episodes = _Episodes(engine, tokenizer, env, step, version, cfg, on_sample, stats)
    await asyncio.gather(*[episodes.trajectory(task, traj, starts.get((task.task_id, traj)))
                           for task in tasks for traj in range(cfg.n_trajectories)])
    return EpisodeBatch(episodes.samples, stats)


async def stream_episodes(engine: Engine, tokenizer: Any, env: RewardEnv, tasks: list[TaskRef],
                          step: int, version: int, cfg: RolloutConfig,
                          stats: BatchStats | None = None,
                          buffer: int | None = None,
                          starts: Starts | None = None) -> AsyncIterator[Sample]:
    """Samples as they are scored; at most ``buffer`` (default ``cfg.stream_buffer``) wait unread."""
    chunks = stream_episode_chunks(engine, tokenizer, env, tasks, step, version, cfg, stats=stats,
                                   buffer=buffer, starts=starts, max_chunk=1)
    try:
        async for chunk in chunks:
            yield chunk[0]
    finally:
        await chunks.aclose()  # stops the trajectories now, not whenever the generator is collected


async def stream_episode_chunks(engine: Engine, tokenizer: Any, env: RewardEnv, tasks: list[TaskRef],
                                step: int, version: int, cfg: RolloutConfig,
                                stats: BatchStats | None = None,
                                buffer: int | None = None,
                                starts: Starts | None = None,
                                max_chunk: int | None = None) -> AsyncIterator[list[Sample]]:
    """Like :func:`stream_episodes`, but each item is every sample scored by then (1 to
    ``max_chunk``, default unbounded): a consumer that pays per item (a Ray stream: one round trip
    each) pays once for the samples of an engine batch that finish together, while a sample that
    finishes alone still goes out at once."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=cfg.stream_buffer if buffer is None else buffer)
    limit = max_chunk if max_chunk is not None else float("inf")
    done = object()

    async def produce() -> None:
        try:
            await run_episodes(engine, tokenizer, env, tasks, step, version, cfg,
                               on_sample=queue.put, stats=stats, starts=starts)
        finally:
            await queue.put(done)

    producer = asyncio.get_running_loop().create_task(produce())
    try:
        finished = False
        while not finished:
            chunk = [await queue.get()]
            while len(chunk) < limit and not queue.empty():
                chunk.append(queue.get_nowait())
            finished = chunk[-1] is done  # the producer's last item: nothing can follow it
            if finished:
                chunk.pop()
            if chunk:
                yield chunk
        await producer  # re-raise what stopped the producer, if anything
    finally:
        if not producer.done():
            producer.cancel()
