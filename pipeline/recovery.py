"""A lost trainer group restarted inside the run (``pipeline.max_trainer_restarts``): the step
loop's part that knows where a restart goes back to and which batches it trains again
(docs/loop.md, "Stopping and failures"). Written by hand: Ray restarts a lost actor
(``max_restarts``) but not a process group of ranks from a checkpoint, with the loop's batches."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

from pipeline.parts import GeneratedBatch, Trainer

# (first step, weights version, batches trained since the restore point) -> awaited once the
# trainer is back: the loop puts the batches back in line and pushes the restored weights
Resume = Callable[[int, int, dict[int, GeneratedBatch]], Awaitable[None]]


class TrainerRecovery:
    """Held by :class:`pipeline.loop.Loop`. It keeps the restore point (first step to train, its
    weights version, the checkpoint dir or None for the run's initial weights) and every batch
    trained since, which the loop reports as it trains (:meth:`trained`) and checkpoints
    (:meth:`checkpointed`)."""

    def __init__(self, max_restarts: int, start_step: int, version: int,
                 resumed_from: Path | None, events: list[tuple[str, int, int]]) -> None:
        self.max_restarts = max_restarts
        self.restarts = 0                # restarts made in this run
        self.restore_point: tuple[int, int, Path | None] = (start_step, version, resumed_from)
        self.kept: dict[int, GeneratedBatch] = {}  # step -> batch trained since the restore point
        self.events = events             # the loop's: a restart is recorded beside its steps

    def trained(self, step: int, batch: GeneratedBatch) -> None:
        """Batch ``step`` is being trained: until a checkpoint holds its effect, a restarted
        trainer trains it again."""
        self.kept[step] = batch

    def checkpointed(self, step: int, version: int, path: Path) -> None:
        self.restore_point = (step + 1, version, path)
        self.kept = {b: g for b, g in self.kept.items() if b > step}

    async def recover(self, trainer: Trainer, step: int, error: BaseException,
                      stop_requested: Callable[[], bool], resume: Resume) -> int:
        """A lost trainer rank (in training, the push or a checkpoint): the whole group starts again
        from the latest checkpoint (or the run's initial weights), then ``resume`` hands the loop
        every batch trained since, to be trained again in order, the same samples (no sample
        regenerated, lost or left in the weights twice). Returns the step to go on from.
        Any other error, a loss past ``pipeline.max_trainer_restarts``, or a loss after a stop was
        requested is raised: a SIGTERM or Ctrl-C sent to the job's process group (a scheduler's
        preemption, ``timeout``) reaches the trainer ranks as well, and restarting them into a job
        that is being stopped only spends its grace period."""
        while True:
            if not await asyncio.to_thread(trainer_lost, trainer, error):
                raise error
            if stop_requested():
                path = self.restore_point[2]
                print(f"[pipeline] the trainer was lost at step {step} after a stop was requested (the "
                      f"signal reaches every process of the job): not restarted; the latest checkpoint "
                      f"is {path or 'none (the run had not written one)'}", file=sys.stderr, flush=True)
                raise error
            if self.restarts >= self.max_restarts:
                print(f"[pipeline] the trainer was lost at step {step} after {self.restarts} restart(s) "
                      f"in this run (pipeline.max_trainer_restarts={self.max_restarts})",
                      file=sys.stderr, flush=True)
                raise error
            self.restarts += 1
            cursor, version, path = self.restore_point
            print(f"[pipeline] trainer lost at step {step} ({type(error).__name__}); restart "
                  f"{self.restarts} of {self.max_restarts} from {path or 'the initial weights'}: steps "
                  f"{cursor}..{step} are trained from it with the batches they had",
                  file=sys.stderr, flush=True)
            self.events.append(("restart", step, version))
            try:
                t0 = time.time()
                await asyncio.to_thread(trainer.restart, str(path) if path is not None else None)
                kept, self.kept = self.kept, {}  # trained since the restore point: trained again
                await resume(cursor, version, kept)
                print(f"[pipeline] trainer restarted in {time.time() - t0:.1f} s; continuing at "
                      f"step {cursor}", file=sys.stderr, flush=True)
                return cursor
            except Exception as e:  # noqa: BLE001 - lost again while restarting: counted, retried
                error = e


def trainer_lost(trainer: Trainer, error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from: a CheckpointError) comes of a lost trainer
    rank: an actor error with one of the group's actor ids (a sampler's is the sampler pool's to
    replace), or any other Ray error (a sampler that could not fetch weights whose owner, trainer
    rank 0, died) while a rank does not answer its ping."""
    from ray.exceptions import RayActorError, RayError

    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    ids = trainer.actor_ids()
    # getattr: Ray's RayTaskError raised "as an instance of" an actor error skips its __init__
    if any(isinstance(c, RayActorError) and getattr(c, "actor_id", None) in ids for c in chain):
        return True
    return any(isinstance(c, RayError) for c in chain) and trainer.lost()

