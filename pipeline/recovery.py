"""A lost trainer group restarted inside the run (``pipeline.max_trainer_restarts``): the step
loop's part that knows what a restart does to the batches, the versions and the log
(docs/loop.md, "Stopping and failures"). Written by hand: Ray restarts a lost actor
(``max_restarts``) but not a process group of ranks from a checkpoint, with the loop's batches."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any


class TrainerRestarts:
    """Mixed into :class:`pipeline.loop.Loop`: ``_restore`` (first step, version, checkpoint dir or
    None) and ``_kept`` (batches trained since) are kept by the loop as it trains and checkpoints."""
    cfg: Any                       # PipelineConfig
    p: Any                         # LoopParts
    version: int
    history: list[dict[str, float]]
    events: list[tuple[str, int, int]]
    trainer_restarts: int
    stop_requested: bool          # SIGTERM/SIGINT seen: the signal usually reached every rank too
    _restore: tuple[int, int, Path | None]
    _kept: dict[int, Any]          # step -> GeneratedBatch
    _ready: dict[int, Any]
    _cond: asyncio.Condition       # and the loop's _push_new(step), the samplers' push

    async def _recover(self, step: int, error: BaseException) -> int:
        """A lost trainer rank (in training, the push or a checkpoint): the whole group starts again
        from the latest checkpoint (or the run's initial weights), the samplers get those weights,
        and every batch trained since goes back to be trained again in order, the same samples (no
        sample regenerated, lost or left in the weights twice). Returns the step to go on from.
        Any other error, a loss past ``pipeline.max_trainer_restarts``, or a loss after a stop was
        requested is raised: a SIGTERM or Ctrl-C sent to the job's process group (a scheduler's
        preemption, ``timeout``) reaches the trainer ranks as well, and restarting them into a job
        that is being stopped only spends its grace period."""
        restart = getattr(self.parts.trainer, "restart", None)
        while True:
            if restart is None or not await asyncio.to_thread(trainer_lost, self.parts.trainer, error):
                raise error
            if self.stop_requested:
                path = self._restore[2]
                print(f"[pipeline] the trainer was lost at step {step} after a stop was requested (the "
                      f"signal reaches every process of the job): not restarted; the latest checkpoint "
                      f"is {path or 'none (the run had not written one)'}", file=sys.stderr, flush=True)
                raise error
            if self.trainer_restarts >= self.cfg.max_trainer_restarts:
                print(f"[pipeline] the trainer was lost at step {step} after "
                      f"{self.trainer_restarts} restart(s) in this run (pipeline.max_trainer_restarts="
                      f"{self.cfg.max_trainer_restarts})", file=sys.stderr, flush=True)
                raise error
            self.trainer_restarts += 1
            cursor, version, path = self._restore
            print(f"[pipeline] trainer lost at step {step} ({type(error).__name__}); restart "
                  f"{self.trainer_restarts} of {self.cfg.max_trainer_restarts} from "
                  f"{path or 'the initial weights'}: steps {cursor}..{step} are trained from it with "
                  f"the batches they had", file=sys.stderr, flush=True)
            self.events.append(("restart", step, version))
            try:
                t0 = time.time()
                await asyncio.to_thread(restart, str(path) if path is not None else None)
                async with self._cond:
                    self._ready.update(self._kept)  # trained since the checkpoint: trained again
                    self._kept = {}
                    self.version = version
                self.history = [h for h in self.history if h["step"] < cursor]
                rewind = getattr(self.parts.logger, "rewind", None)
                if rewind is not None:
                    rewind(cursor)
                await self._push_new(cursor - 1)  # the samplers at the restored weights
                print(f"[pipeline] trainer restarted in {time.time() - t0:.1f} s; continuing at "
                      f"step {cursor}", file=sys.stderr, flush=True)
                return cursor
            except Exception as e:  # noqa: BLE001 - lost again while restarting: counted, retried
                error = e


def trainer_lost(trainer: Any, error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from: a CheckpointError) comes of a lost trainer
    rank: an actor error with one of the group's actor ids (a sampler's is the sampler pool's to
    replace), or any other Ray error (a sampler that could not fetch weights whose owner, trainer
    rank 0, died) while a rank does not answer its ping."""
    from ray.exceptions import RayActorError, RayError

    chain, e = [], error
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    ids = getattr(trainer, "actor_ids", None)
    if ids is not None and any(isinstance(c, RayActorError) and getattr(c, "actor_id", None) in ids()
                               for c in chain):
        return True
    lost = getattr(trainer, "lost", None)
    return lost is not None and any(isinstance(c, RayError) for c in chain) and lost()
