"""What the step loop needs of each part, as Protocols: the real parts (SamplerGroup, TrainerGroup,
the pipeline.weight_sync push objects, MetricsLogger) satisfy them structurally, and so does a
test's fake, which is how the schedule is tested in seconds without Ray or a model
(tests/pipeline/test_loop_schedule.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Protocol, runtime_checkable

from pipeline.sample import Sample


class WeightsGone(RuntimeError):
    """Raised by ``Samplers.generate``: a replacement worker could not be handed the last weights
    (the payload's owner, trainer rank 0, is gone with them: a trainer restart). The worker is in
    place at its initial weights; the loop generates the batch again after the next push."""


@runtime_checkable
class Samplers(Protocol):
    """Streams the samples of one batch; ``version`` is the weights version the caller believes
    the samplers hold (a sample's own ``policy_version`` is what generated it). May raise
    :class:`WeightsGone`."""

    def generate(self, step: int, tasks: list[Any], version: int) -> AsyncIterator[Sample]: ...


@runtime_checkable
class Trainer(Protocol):
    """One RL step on a TrainBatch (blocking: the loop runs it in a thread); a checkpoint."""

    def train(self, batch: Any, loss_scale_factor: int | None = None) -> dict[str, float]: ...

    def save(self, directory: str) -> None: ...


@runtime_checkable
class WeightPush(Protocol):
    """Sends the trainer's current weights to every sampler as ``version``; returns seconds."""

    async def push(self, version: int) -> float: ...


@runtime_checkable
class Logger(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_table(self, step: int, samples: list[Sample], decode: Any = None) -> None: ...

    def log_image(self, step: int, key: str, path: Path) -> None: ...


@runtime_checkable
class CheckpointSettings(Protocol):
    every: int
    at_end: bool
    dir: str
    keep_last: int
