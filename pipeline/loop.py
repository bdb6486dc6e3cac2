"""The step loop: generate a batch, train on it, push the new weights, with generation allowed
to run up to k weights versions ahead of training (``pipeline.max_staleness``; k = 0 is the
synchronous schedule, k = 1 the one-off one: train batch N while the samplers generate batch N+1
with weights N). One schedule serves every k; its parts come in as ``LoopParts`` (Protocols of
pipeline/parts.py), so a test drives it with fakes.

Versions: the trainer's weights after v training steps are version v, and step ``b`` trains batch
``b`` with version ``b``. The samplers start batch ``b`` only once they hold a version >= b - k;
a trajectory found over the bound at train time is dropped or generated again
(``pipeline.staleness_policy``). A push goes out as soon as a step has trained;
``pipeline.partial_rollout=false`` holds it until the batch in flight is generated (one version
per batch), ``true`` lets it reach the samplers mid-batch, where the engine applies it between its
batches (a trajectory's later turns then carry the newer version). docs/loop.md has the schedule
and its figures; pipeline/staleness.py the bound's arithmetic.
"""
from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pipeline import checkpoint
from pipeline.algorithms import mean_score, skip_reason
from pipeline.heartbeat import Activity, progress_bar
from pipeline.metrics import step_metrics
from pipeline.parts import GeneratedBatch, LoopParts, WeightsGone
from pipeline.recovery import TrainerRecovery
from pipeline.sample import Sample
from pipeline.staleness import (POLICIES, lag_metrics, over_bound, pending_by_step, resolve_staleness,
                                schedule_name, split_stale, staleness_counts)
from pipeline.loop_config import PipelineConfig
from pipeline.timeline import Drawer


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


SAME_STOP_S = 1.0  # a stop request this soon after the first is the same one, delivered twice


class Loop:
    def __init__(self, cfg: PipelineConfig, parts: LoopParts, timeline_every: int,
                 start_step: int = 0, version: int = 0, pending: list[Sample] | None = None,
                 resumed_from: Path | None = None) -> None:
        self.k = resolve_staleness(cfg.mode, cfg.max_staleness)
        if cfg.staleness_policy not in POLICIES:
            raise ValueError(f"pipeline.staleness_policy={cfg.staleness_policy!r}: expected one of "
                             f"{POLICIES}")
        self.cfg, self.parts = cfg, parts
        self.timeline_every = timeline_every
        self.start_step, self.version, self.pending = start_step, version, pending
        self.sampler_version = version   # what the samplers hold: the trainer's until a step trains
        self.history: list[dict[str, float]] = []
        # (what, batch or version, version): the schedule as it ran, for tests and debugging
        self.events: list[tuple[str, int, int]] = []
        self._drawer = Drawer(parts.run_dir)
        self._ready: dict[int, GeneratedBatch] = {}
        self._done: list[GeneratedBatch] = []  # in completion order (step timing)
        self._gen_error: BaseException | None = None
        self.stop_requested = False
        self._stop_at = 0.0  # monotonic time of the first stop request
        self._task: asyncio.Task | None = None  # the step loop's task: a second stop request cancels it
        self._stop_event: asyncio.Event | None = None  # set by a stop request; made in the running loop
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._notifying: asyncio.Future | None = None
        self.recovery = TrainerRecovery(  # where a lost trainer restarts from, what it trains again
            cfg.max_trainer_restarts, start_step, version, resumed_from, self.events)
        self.best_batch: tuple[int, float] | None = None  # (step, mean score) of the best batch so far
        self._pushes = 0  # pushes made (a batch whose weights were gone waits for the next)
        self.activity = Activity()  # what each part is doing: the heartbeat's line

    def request_stop(self) -> None:
        """SIGTERM (preemption, scancel) or Ctrl-C: finish the step under way, checkpoint it, stop.
        A second one abandons the step: the run stops at once, its last checkpoint kept. One
        arriving within SAME_STOP_S of the first is the same request: one signal often reaches the
        driver twice (coreutils ``timeout`` signals the command, then its whole process group; a
        scheduler may signal the job's processes and the step's)."""
        now = time.monotonic()
        if self.stop_requested and now - self._stop_at < SAME_STOP_S:
            return
        if self.stop_requested:
            print("[pipeline] second stop request: abandoning the step under way", file=sys.stderr, flush=True)
            if self._task is not None:
                self._task.cancel()
            return
        self.stop_requested, self._stop_at = True, now
        if self._aloop is not None:  # from a signal handler in the loop, or from a thread
            self._aloop.call_soon_threadsafe(self._wake_on_stop)
        print("[pipeline] stop requested (Ctrl-C again abandons the step): finishing this step, "
              "then a checkpoint", file=sys.stderr, flush=True)

    # ---- the three parts ---------------------------------------------------------------
    async def generate(self, step: int, version: int, tasks: list[Any] | None = None) -> GeneratedBatch:
        if tasks is None:
            tasks = batch_tasks(self.parts.tasks, step, self.cfg.tasks_per_batch, self.cfg.seed,
                                self.cfg.shuffle_tasks)
        self.events.append(("gen", step, version))
        samples: list[Sample] = []
        bar = progress_bar(self.cfg.progress, self.parts.expected_samples, f"gen {step}")
        t0 = time.time()
        with self.activity.doing("sampler", f"generating batch {step}"):
            async for s in self.parts.samplers.generate(step, tasks, version):
                samples.append(s)
                bar.update(1)
        t1 = time.time()
        bar.close()
        last_token = max((s.t_gen_end for s in samples if s.t_gen_end), default=t1)
        first = min((s.t_gen_start for s in samples if s.t_gen_start), default=t0)
        self.parts.timeline.add("sampler", "gen", step, first, last_token)
        self.parts.timeline.add_rewards(step, [(s.t_gen_end, s.t_eval_end) for s in samples
                                           if s.t_gen_end and s.t_eval_end])
        extra = {k: v for k, v in self.parts.samplers.last_stats.metrics().items()
                 if k.startswith(("rollout/", "perf/"))}
        self.events.append(("gen_done", step, version))
        return GeneratedBatch(step, version, samples, t0, t1, last_token, extra)

    async def train(self, gen: GeneratedBatch, trainer_version: int) -> tuple[dict[str, float], float]:
        t0 = time.time()
        self.events.append(("train", gen.step, trainer_version))
        metrics: dict[str, float] = lag_metrics(gen.samples, trainer_version, self.k)
        # in a thread: padding a large batch is real work, and the event loop must keep
        # draining the sampler streams of the batch being generated alongside
        batch = await asyncio.to_thread(self.parts.build_batch, gen.samples, gen.step)
        if gen.samples:  # the best batch so far, for a skipped step's reason
            mean = mean_score(gen.samples)
            if self.best_batch is None or mean > self.best_batch[1]:
                self.best_batch = (gen.step, mean)
        metrics.update({k: float(v) for k, v in batch.metrics.items() if isinstance(v, (int, float))})
        if int(batch.input_ids.shape[0]) == 0:  # nothing to learn from this batch: say why, once per step
            metrics["actor/skipped"] = 1.0
            print(f"[pipeline] step {gen.step} trains on nothing: "
                  f"{skip_reason(metrics, gen.samples, self.best_batch)}", file=sys.stderr, flush=True)
        else:
            with self.activity.doing("trainer", f"training batch {gen.step}"):
                metrics.update(await asyncio.to_thread(
                    self.parts.trainer.train, batch, self.parts.response_length(gen.step)))
            metrics["actor/skipped"] = 0.0
        t1 = time.time()
        self.parts.timeline.add("trainer", "train", gen.step, t0, t1)
        return metrics, t1 - t0

    async def push(self, version: int, step: int) -> float:
        t0 = time.time()
        self.events.append(("push", version, step))
        with self.activity.doing("push", f"pushing weights v{version}"):
            await self.parts.weight_push.push(version)
        t1 = time.time()
        self.parts.timeline.add("push", "push", step, t0, t1)
        return t1 - t0

    # ---- the schedule ----------------------------------------------------------------
    async def run(self) -> list[dict[str, float]]:
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        handled = []
        for sig in (signal.SIGTERM, signal.SIGINT):  # Ctrl-C does what a preemption does
            try:
                loop.add_signal_handler(sig, self.request_stop)
                handled.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        try:
            return await self._run()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    async def _generator(self, carried: set[int]) -> None:
        """Batches in order, each once the samplers hold a version within the bound."""
        try:
            for b in range(self.start_step, self.cfg.steps):
                if b in carried:  # carried over by a checkpoint: not generated twice
                    continue
                t0 = time.time()
                while True:
                    async with self._cond:
                        await self._cond.wait_for(lambda: self.sampler_version >= b - self.k)
                        pushes = self._pushes
                    try:
                        # held while generating: a push that must not land mid-batch takes it first
                        async with self._sampler_lock:
                            gen = await self.generate(b, self.sampler_version)
                        break
                    except WeightsGone as e:  # its samples are dropped; made again after a push
                        print(f"[pipeline] batch {b} is generated again after the next push: {e}",
                              file=sys.stderr, flush=True)
                        async with self._cond:
                            await self._cond.wait_for(lambda: self._pushes != pushes)
                gen.gen_wait = max(0.0, gen.t_start - t0)
                async with self._cond:
                    self._ready[b] = gen
                    self._done.append(gen)
                    self._cond.notify_all()
        except BaseException as e:
            async with self._cond:
                self._gen_error = e
                self._cond.notify_all()
            raise

    async def _take(self, step: int) -> GeneratedBatch | None:
        """Batch ``step`` once generated; None if a stop request comes first (a batch already
        generated is still trained)."""
        async with self._cond:
            await self._cond.wait_for(lambda: step in self._ready or self._gen_error is not None
                                      or self.stop_requested)
            if step in self._ready:
                return self._ready.pop(step)
            if self._gen_error is not None:
                raise RuntimeError(f"generation of batch {step} failed") from self._gen_error
            return None

    def _wake_on_stop(self) -> None:
        """In the loop: whatever waits on a batch or on the samplers' lock sees the stop request."""
        assert self._stop_event is not None
        self._stop_event.set()

        async def notify() -> None:
            async with self._cond:
                self._cond.notify_all()

        self._notifying = asyncio.ensure_future(notify())  # held: the loop keeps only weak references

    async def _within_bound(self, gen: GeneratedBatch) -> dict[str, float]:
        """Trajectories over the bound are dropped, or (wait) their tasks generated again with the
        samplers' current weights; whatever is still over after that is dropped."""
        stale = over_bound(gen.samples, self.version, self.k)
        dropped = waited = 0
        t0 = time.time()
        if stale and self.cfg.staleness_policy == "wait":
            ids = {task_id for task_id, _ in stale}
            tasks = [t for t in batch_tasks(self.parts.tasks, gen.step, self.cfg.tasks_per_batch,
                                            self.cfg.seed, self.cfg.shuffle_tasks) if t.task_id in ids]
            async with self._sampler_lock:
                again = await self.generate(gen.step, self.sampler_version, tasks)
            waited = sum(s.task_id in ids for s in gen.samples)
            gen.samples = [s for s in gen.samples if s.task_id not in ids] + again.samples
            stale = over_bound(gen.samples, self.version, self.k)
        if stale:
            gen.samples, gone = split_stale(gen.samples, stale)
            dropped = len(gone)
        return staleness_counts(dropped, waited, time.time() - t0 if waited else 0.0, gen.gen_wait)

    async def _push_new(self, step: int) -> float:
        if self.cfg.partial_rollout:
            t = await self.push(self.version, step)
        elif not await self._sampler_lock_unless_stopping():
            return 0.0  # stopping: the batch in flight is made again on resume, the checkpoint holds the weights
        else:
            try:
                t = await self.push(self.version, step)
            finally:
                self._sampler_lock.release()
        async with self._cond:
            self.sampler_version = self.version
            self._pushes += 1
            self._cond.notify_all()
        return t

    async def _sampler_lock_unless_stopping(self) -> bool:
        """The samplers' lock, taken once the batch in flight is generated, unless a stop request
        comes first (False, lock not held). A stop must not wait on that batch: its tail can be a
        build that runs to the sandbox's compile timeout, past a preemption's grace period, and then
        the step just trained is lost with its checkpoint (2026-12-07, H100: a SIGTERM's step waited
        >120 s on three builds)."""
        assert self._stop_event is not None  # made by _run
        acquire = asyncio.ensure_future(self._sampler_lock.acquire())
        stop = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the step abandoned (a second stop request): nothing left holding the lock
            if acquire.done() and not acquire.cancelled():
                self._sampler_lock.release()
            raise
        finally:
            stop.cancel()
            if not acquire.done():
                acquire.cancel()
        return acquire.done() and not acquire.cancelled()

    async def _run(self) -> list[dict[str, float]]:
        cfg = self.cfg
        self._cond, self._sampler_lock = asyncio.Condition(), asyncio.Lock()
        self._stop_event, self._aloop = asyncio.Event(), asyncio.get_running_loop()
        if self.stop_requested:
            self._stop_event.set()
        if cfg.initial_weight_push or self.start_step > 0:
            await self.push(self.version, self.start_step - 1)
        for b, samples in pending_by_step(self.pending).items():
            if self.start_step <= b < cfg.steps:
                now = time.time()
                self._ready[b] = GeneratedBatch(b, min(s.policy_version for s in samples), samples,
                                           now, now, now)
        producer = asyncio.get_running_loop().create_task(self._generator(set(self._ready)))
        beat = None
        if cfg.heartbeat_s > 0 and not cfg.progress:  # bars say it on a terminal
            beat = asyncio.get_running_loop().create_task(
                self.activity.beat(cfg.heartbeat_s, self.parts.samplers, self.parts.expected_samples))
        try:
            await self._steps()
        finally:
            if beat is not None:
                beat.cancel()
            if not producer.done():
                producer.cancel()
                try:
                    await producer
                except (asyncio.CancelledError, Exception):  # the trainer side's error is the news
                    pass
        self._draw(int(self.history[-1]["step"]) if self.history else cfg.steps - 1, final=True)
        return self.history

    async def _steps(self) -> None:
        cfg = self.cfg
        steps_bar = progress_bar(cfg.progress, cfg.steps, "steps", position=1, initial=self.start_step)
        step = self.start_step
        while step < cfg.steps:
            try:
                saved = await self._step(step, steps_bar)
                if saved is None:  # stopped while batch `step` was being generated
                    step -= 1
                    saved = self._checkpoint_before(step + 1)
            except Exception as e:  # noqa: BLE001 - only a lost trainer is handled; the rest re-raised
                step = await self.recovery.recover(self.parts.trainer, step, e,
                                                   lambda: self.stop_requested, self._resume_at)
                continue
            if self.stop_requested and step + 1 < cfg.steps:
                trained = step >= self.start_step
                print((f"[pipeline] stopped after step {step}" if trained else
                       f"[pipeline] stopped before step {step + 1}, nothing trained in this run") + (
                    f"; {'checkpoint written' if trained else 'its checkpoint stays'}: the same command "
                    f"continues at step {step + 1} (resume=auto, hydra.run.dir={self.parts.run_dir})"
                    if saved else ""), file=sys.stderr, flush=True)
                break
            step += 1
        steps_bar.close()

    async def _resume_at(self, cursor: int, version: int, batches: dict[int, GeneratedBatch]) -> None:
        """The trainer restarted at ``version``: the batches trained since go back in line to be
        trained again from step ``cursor``, whose log lines are written again, and the samplers get
        the restored weights."""
        async with self._cond:
            self._ready.update(batches)
            self.version = version
        self.history = [h for h in self.history if h["step"] < cursor]
        self.parts.logger.rewind(cursor)
        await self._push_new(cursor - 1)

    async def _step(self, step: int, steps_bar: Any) -> bool | None:
        """Train batch ``step``, push, log, checkpoint when due; whether a checkpoint was written,
        None if a stop request came while that batch was being generated (nothing trained)."""
        t_step = time.time()
        cur = await self._take(step)
        if cur is None:
            return None
        self.recovery.trained(step, cur)
        prologue = 0.0
        if step == self.start_step and self.k > 0:  # the first batch has nothing to overlap
            prologue, t_step = time.time() - t_step, time.time()
        bound = await self._within_bound(cur)
        metrics, t_train = await self.train(cur, self.version)
        metrics.update(bound)
        self.version += 1
        t_push = await self._push_new(step)
        t_total = time.time() - t_step
        # the batch generated during this step (sync: this one; one_off: the next)
        fresh = [g for g in self._done if g.t_end >= t_step]
        self._done = self._done[-(self.k + 2):]  # only timings are read; samples go with training
        metrics.update(step_metrics(cur, fresh[-1] if fresh else None, t_train, t_push, t_total,
                                     self.parts.rollout_metrics))
        if prologue:
            metrics["timing_s/prologue_gen"] = prologue
        metrics["pipeline/weights_version"] = float(self.version)
        metrics["pipeline/trainer_restarts"] = float(self.recovery.restarts)
        split = self.parts.weight_push.last_stats  # the push's own split of its seconds
        metrics.update({f"pipeline/push_{k}": float(split[k])
                        for k in ("transport_s", "load_s", "check_s") if k in split})
        self._log(step, metrics, cur.samples)
        saved = self._maybe_checkpoint(step, force=self.stop_requested)
        steps_bar.set_postfix_str(f"reward {metrics.get('critic/score/mean', 0.0):.3f}")
        steps_bar.update(1)
        return saved

    # ---- bookkeeping -----------------------------------------------------------------
    def _log(self, step: int, metrics: dict[str, float], samples: list[Sample]) -> None:
        self.activity.logged()
        self.history.append({"step": step, **metrics})
        self._log_drawn(step, wait=False)
        self.parts.logger.log(step, metrics)
        self.parts.logger.log_table(step, samples, self.parts.decode)
        self.parts.logger.log_samples(samples)
        if self.timeline_every > 0 and (step + 1) % self.timeline_every == 0:
            self._draw(step)

    def _draw(self, step: int, final: bool = False) -> None:
        """Drawn in a thread; the image is logged with the next step's metrics (W&B steps only go
        forward)."""
        if not self.parts.timeline.spans:
            return
        self._drawer.submit(self.parts.timeline, f"{schedule_name(self.k)}: step {step}")
        if final:
            self._log_drawn(step, wait=True)
            self._drawer.close()

    def _log_drawn(self, step: int, wait: bool) -> None:
        path = self._drawer.drawn(wait)
        if path is not None:
            self.parts.logger.log_image(step, "timeline", path)

    def _checkpoint_before(self, step: int) -> bool:
        """A stop while batch ``step`` was being generated (a preemption's grace is often shorter
        than a batch of new builds): the step before is checkpointed, unless it already is or
        this run trained none; whether a checkpoint of it exists. The batch is generated again on
        resume."""
        if step <= self.start_step:
            return self.start_step > 0  # a resumed run's own checkpoint
        return self.recovery.restore_point[0] == step or self._maybe_checkpoint(step - 1, force=True)

    def _maybe_checkpoint(self, step: int, force: bool = False) -> bool:
        c = self.parts.checkpoint_cfg
        last = step == self.cfg.steps - 1
        if not (force or (c.every > 0 and (step + 1) % c.every == 0) or (last and c.at_end)):
            return False
        # batches generated and not trained yet (up to k) go with it; one still being generated
        # is generated again on resume (its tasks are a function of its index)
        pending = [s for b in sorted(self._ready) if b > step for s in self._ready[b].samples]
        state = {"version": self.version, "cursor": step + 1, "pending": pending or None}
        t0 = time.time()
        # in the loop's own thread: saving it in another thread (so the batch being generated kept
        # flowing) broke one_off's overlap of train N and generate N+1 after a checkpoint step
        # (test_toy_learns_through_the_pipeline[one_off], fresh-clone CI, 2026-12-04)
        path = checkpoint.save(self.parts.run_dir / c.dir, step, self.parts.trainer, state, c.keep_last)
        self.recovery.checkpointed(step, self.version, path)
        print(f"[pipeline] checkpoint of step {step} written in {time.time() - t0:.2f} s",
              file=sys.stderr, flush=True)
        self.events.append(("checkpoint", step, self.version))
        return True

