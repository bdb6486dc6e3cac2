"""The step loop: ``sync`` (generate -> train -> push weights) or ``one_off`` (train batch N on
the trainer pool while the sampler pool generates batch N+1 with weights N-1, then push weights
N). Both share every part but the schedule.

Versions: the trainer's weights after v optimiser rounds are version v; samples carry the version
that generated them, so ``pipeline/policy_lag`` = trainer version at train time - sample version
(0 in sync mode, 1 in one_off after the first step).
"""
from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from omegaconf import MISSING

from pipeline import checkpoint
from pipeline.metrics import sandbox_metrics, score_metrics
from pipeline.sample import Sample
from pipeline.timeline import Timeline

MODES = ("one_off", "sync")


@dataclass
class PipelineConfig:
    mode: str = MISSING              # one_off | sync
    steps: int = MISSING             # training steps (batches trained)
    tasks_per_batch: int = MISSING   # Kevin: 8
    task_split: str = MISSING        # the env split to train on
    shuffle_tasks: bool = MISSING    # new task order each pass over the split (seeded)
    weight_sync: str = MISSING       # auto | object_store | cuda_ipc | broadcast
    initial_weight_sync: bool = MISSING  # push the trainer's weights before the first batch
    progress: bool = MISSING         # progress bars on generation / training
    seed: int = MISSING


def batch_tasks(tasks: list[Any], batch: int, k: int, seed: int, shuffle: bool) -> list[Any]:
    """Tasks of batch ``batch``: a pure function of the index, so resuming needs only the index."""
    if not tasks:
        raise ValueError("the training split has no tasks")
    n = len(tasks)
    out = []
    for j in range(batch * k, batch * k + k):
        epoch, pos = divmod(j, n)
        order = list(range(n))
        if shuffle:
            random.Random(seed * 100003 + epoch).shuffle(order)
        out.append(tasks[order[pos]])
    return out


@dataclass
class Generated:
    step: int
    version: int
    samples: list[Sample]
    t_start: float
    t_end: float
    last_token: float                # last generated token of the batch
    rollout: dict[str, float] = field(default_factory=dict)  # the sampler pool's batch stats

    @property
    def wall(self) -> float:
        return self.t_end - self.t_start

    @property
    def reward_tail(self) -> float:
        return max(0.0, self.t_end - self.last_token)


@dataclass
class LoopParts:
    """What the loop drives; built by pipeline.main (or a test)."""

    samplers: Any                    # SamplerPool: async generate(step, tasks, version), update_weights
    trainer: Any                     # TrainerGroup: train(batch, loss_scale_factor), save(dir)
    weight_sync: Any                 # WeightSync: async push(version) -> seconds
    tasks: list[Any]                 # TaskRefs of the training split
    build_batch: Callable[[list[Sample], int], Any]    # (samples, step) -> TrainBatch | None
    rollout_metrics: Callable[[list[Sample]], dict[str, float]]
    response_length: Callable[[int], int]              # step -> max response length
    expected_samples: int            # per batch, for the progress bar
    logger: Any                      # MetricsLogger
    run_dir: Path
    checkpoint_cfg: Any
    decode: Callable[[list[int]], str] = lambda ids: ""   # token ids -> text (episode table)
    timeline: Timeline = field(default_factory=Timeline)


class Loop:
    def __init__(self, cfg: PipelineConfig, parts: LoopParts, timeline_every: int,
                 start_step: int = 0, version: int = 0, pending: list[Sample] | None = None) -> None:
        if cfg.mode not in MODES:
            raise ValueError(f"pipeline.mode={cfg.mode!r}: expected one of {MODES}")
        self.cfg, self.p = cfg, parts
        self.timeline_every = timeline_every
        self.start_step, self.version, self.pending = start_step, version, pending
        self.history: list[dict[str, float]] = []
        self._drawer: ThreadPoolExecutor | None = None
        self._pending_draws: list[Future] = []
        self.stop_requested = False

    def request_stop(self) -> None:
        """SIGTERM (preemption, scancel): finish the step under way, checkpoint it, stop."""
        self.stop_requested = True
        print("[pipeline] stop requested: finishing this step, then a checkpoint", file=sys.stderr, flush=True)

    # ---- the two halves --------------------------------------------------------------
    async def generate(self, step: int, version: int) -> Generated:
        tasks = batch_tasks(self.p.tasks, step, self.cfg.tasks_per_batch, self.cfg.seed,
                            self.cfg.shuffle_tasks)
        samples: list[Sample] = []
        bar = _bar(self.cfg.progress, self.p.expected_samples, f"gen {step}")
        t0 = time.time()
        async for s in self.p.samplers.generate(step, tasks, version):
            samples.append(s)
            if bar is not None:
                bar.update(1)
        t1 = time.time()
        if bar is not None:
            bar.close()
        last_token = max((s.t_gen_end for s in samples if s.t_gen_end), default=t1)
        first = min((s.t_gen_start for s in samples if s.t_gen_start), default=t0)
        self.p.timeline.add("sampler", "gen", step, first, last_token)
        self.p.timeline.add_rewards(step, [(s.t_gen_end, s.t_eval_end) for s in samples
                                           if s.t_gen_end and s.t_eval_end])
        stats = getattr(self.p.samplers, "last_stats", None)
        extra = {k: v for k, v in stats.metrics().items() if k.startswith(("rollout/", "perf/"))} \
            if stats is not None and hasattr(stats, "metrics") else {}
        return Generated(step, version, samples, t0, t1, last_token, extra)

    async def train(self, gen: Generated, trainer_version: int) -> tuple[dict[str, float], float]:
        t0 = time.time()
        metrics: dict[str, float] = {}
        lag = [trainer_version - s.policy_version for s in gen.samples]
        metrics["pipeline/policy_lag"] = sum(lag) / len(lag) if lag else 0.0
        metrics["pipeline/policy_lag_max"] = float(max(lag, default=0))
        # in a thread: padding a large batch is real work, and the event loop must keep
        # draining the sampler streams of the batch being generated alongside
        batch = await asyncio.to_thread(self.p.build_batch, gen.samples, gen.step)
        metrics.update({k: float(v) for k, v in getattr(batch, "metrics", {}).items()
                        if isinstance(v, (int, float))})
        rows = 0 if batch is None else int(batch.input_ids.shape[0])
        if rows == 0:  # every group had zero advantage: nothing to learn from this batch
            metrics["actor/skipped"] = 1.0
        else:
            metrics.update(await asyncio.to_thread(
                self.p.trainer.train, batch, self.p.response_length(gen.step)))
            metrics["actor/skipped"] = 0.0
        t1 = time.time()
        self.p.timeline.add("trainer", "train", gen.step, t0, t1)
        return metrics, t1 - t0

    async def push(self, version: int, step: int) -> float:
        t0 = time.time()
        await self.p.weight_sync.push(version)
        t1 = time.time()
        self.p.timeline.add("sync", "sync", step, t0, t1)
        return t1 - t0

    # ---- the schedule ----------------------------------------------------------------
    async def run(self) -> list[dict[str, float]]:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGTERM, self.request_stop)
            handled = True
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            handled = False
        try:
            return await self._run()
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGTERM)

    async def _run(self) -> list[dict[str, float]]:
        cfg = self.cfg
        if cfg.initial_weight_sync or self.start_step > 0:
            await self.push(self.version, self.start_step - 1)
        nxt: Generated | None = None
        prologue = 0.0
        if cfg.mode == "one_off" and self.start_step < cfg.steps:
            if self.pending:  # the batch a checkpoint carried over: not generated twice
                s = self.pending
                nxt = Generated(self.start_step, s[0].policy_version if s else self.version, s,
                                time.time(), time.time(), time.time())
            else:
                t0 = time.time()
                nxt = await self.generate(self.start_step, self.version)
                prologue = time.time() - t0
        steps_bar = _bar(cfg.progress, cfg.steps, "steps", position=1, initial=self.start_step)
        for step in range(self.start_step, cfg.steps):
            t_step = time.time()
            if cfg.mode == "sync":
                cur = await self.generate(step, self.version)
                gen_for_timing = cur
                metrics, t_train = await self.train(cur, self.version)
                nxt = None
            else:
                cur = nxt
                more = step + 1 < cfg.steps
                results = await asyncio.gather(
                    self.train(cur, self.version),
                    self.generate(step + 1, self.version) if more else _none())
                (metrics, t_train), nxt = results
                gen_for_timing = nxt
            self.version += 1
            t_sync = await self.push(self.version, step)
            t_total = time.time() - t_step
            metrics.update(self._step_metrics(cur, gen_for_timing, t_train, t_sync, t_total))
            if step == self.start_step and prologue:
                metrics["timing/prologue_gen"] = prologue
            metrics["pipeline/weights_version"] = float(self.version)
            self._log(step, metrics, cur.samples)
            saved = self._maybe_checkpoint(step, nxt, force=self.stop_requested)
            if steps_bar is not None:
                steps_bar.set_postfix_str(f"reward {metrics.get('reward/mean', 0.0):.3f}")
                steps_bar.update(1)
            if self.stop_requested and step + 1 < cfg.steps:
                print(f"[pipeline] stopped after step {step}" + (
                    f"; checkpoint written, resume=auto continues at step {step + 1}" if saved else ""),
                      file=sys.stderr, flush=True)
                break
        if steps_bar is not None:
            steps_bar.close()
        self._draw(int(self.history[-1]["step"]) if self.history else cfg.steps - 1, final=True)
        return self.history

    # ---- bookkeeping -----------------------------------------------------------------
    def _step_metrics(self, trained: Generated, gen: Generated | None, t_train: float,
                      t_sync: float, t_total: float) -> dict[str, float]:
        m: dict[str, float] = dict(trained.rollout)
        m.update(self.p.rollout_metrics(trained.samples))
        m.update(score_metrics(trained.samples))
        m.update(sandbox_metrics(trained.samples, trained.wall))
        t_gen = gen.wall if gen is not None else 0.0
        m["timing/gen"] = (gen.last_token - gen.t_start) if gen is not None else 0.0
        m["timing/reward_tail"] = gen.reward_tail if gen is not None else 0.0
        m["timing/gen_total"] = t_gen
        m["timing/train"] = t_train
        m["timing/weight_sync"] = t_sync
        m["timing/step"] = t_total
        ideal = max(t_gen, t_train) + t_sync
        m["pipeline/efficiency"] = ideal / t_total if t_total > 0 else 0.0
        m["pipeline/trainer_idle"] = max(0.0, 1.0 - t_train / t_total) if t_total > 0 else 0.0
        m["pipeline/sampler_idle"] = max(0.0, 1.0 - t_gen / t_total) if t_total > 0 else 0.0
        tokens = sum(len(s.response_ids) for s in trained.samples)
        m["perf/tokens_per_s"] = tokens / trained.wall if trained.wall > 0 else 0.0
        m["perf/samples"] = float(len(trained.samples))
        return m

    def _log(self, step: int, metrics: dict[str, float], samples: list[Sample]) -> None:
        self.history.append({"step": step, **metrics})
        self._log_drawn(step, wait=False)
        self.p.logger.log(step, metrics)
        self.p.logger.log_table(step, samples, self.p.decode)
        if self.timeline_every > 0 and (step + 1) % self.timeline_every == 0:
            self._draw(step)

    def _draw(self, step: int, final: bool = False) -> None:
        """Draw off the step's critical path (matplotlib costs ~0.3 s a figure, ~1 s the first);
        the image is logged with the next step's metrics (W&B steps only go forward)."""
        if not self.p.timeline.spans:
            return
        if self._drawer is None:
            self._drawer = ThreadPoolExecutor(1, thread_name_prefix="timeline")
        snapshot = Timeline()
        snapshot.spans = list(self.p.timeline.spans)
        run_dir, title = self.p.run_dir, f"{self.cfg.mode}: step {step}"

        def job() -> Path:
            snapshot.to_jsonl(run_dir / "timeline.jsonl")
            return snapshot.draw(run_dir / "timeline.png", title=title)

        self._pending_draws.append(self._drawer.submit(job))
        if final:
            self._log_drawn(step, wait=True)
            self._drawer.shutdown(wait=True)
            self._drawer = None

    def _log_drawn(self, step: int, wait: bool) -> None:
        while self._pending_draws and (wait or self._pending_draws[0].done()):
            path = self._pending_draws.pop(0).result()
            if not self._pending_draws:  # only the newest image is worth a log entry
                self.p.logger.log_image(step, "timeline", path)

    def _maybe_checkpoint(self, step: int, nxt: Generated | None, force: bool = False) -> bool:
        c = self.p.checkpoint_cfg
        last = step == self.cfg.steps - 1
        if not (force or (c.every > 0 and (step + 1) % c.every == 0) or (last and c.at_end)):
            return False
        state = {"version": self.version, "cursor": step + 1,
                 "pending": nxt.samples if nxt is not None else None}
        checkpoint.save(self.p.run_dir / c.dir, step, self.p.trainer, state, c.keep_last)
        return True


async def _none() -> None:
    return None


def _bar(enabled: bool, total: int, desc: str, position: int = 0, initial: int = 0) -> Any:
    """tqdm on stderr: samples of the batch being generated (and scored); training steps."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=position > 0, file=sys.stderr, dynamic_ncols=True,
                position=position, initial=initial)
