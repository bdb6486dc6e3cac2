"""What the step loop needs of each part, as Protocols that declare every member the loop (and its
heartbeat and trainer recovery) uses: the real parts (SamplerGroup, TrainerGroup, the
pipeline.weight_push push objects, MetricsLogger) satisfy them structurally, and so does a test's
fake, which is how the schedule is tested in seconds without Ray or a model
(tests/pipeline/test_loop_schedule.py). ``LoopParts`` holds them for the loop; ``GeneratedBatch``
is what generating one batch hands to training."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Protocol, runtime_checkable

from pipeline.checkpoint_config import CheckpointConfig
from pipeline.sample import Sample
from pipeline.timeline import Timeline

if TYPE_CHECKING:
    from pipeline.algorithms.batch import TrainBatch
    from pipeline.rollout import BatchStats


class WeightsGone(RuntimeError):
    """Raised by ``Samplers.generate``: a replacement worker could not be handed the last weights
    (the payload's owner, trainer rank 0, is gone with them: a trainer restart). The worker is in
    place at its initial weights; the loop generates the batch again after the next push."""


# how many times one sampler worker may be lost (and replaced) within one call: a batch, a push,
# a start; a push interrupted by such losses is made again as many times
LOSSES_PER_CALL = 3


class PushInterrupted(RuntimeError):
    """Raised by the samplers' ``receive_weights`` to a push: a worker was lost inside a push whose
    payload cannot be handed again (a broadcast: the tensors travel once, in a collective the lost
    worker was part of). It has been replaced, and every other worker's load has ended; the push
    is to be made again, in a new group."""


@runtime_checkable
class Samplers(Protocol):
    """Streams the samples of one batch; ``version`` is the weights version the caller believes
    the samplers hold (a sample's own ``policy_version`` is what generated it). May raise
    :class:`WeightsGone`."""

    last_stats: BatchStats  # of the last batch generated (its rollout/* and perf/* metrics are logged)

    def generate(self, step: int, tasks: list[Any], version: int) -> AsyncIterator[Sample]: ...

    async def progress(self) -> list[dict[str, float]]:
        """Per worker, the batch being generated in numbers (``generated``, ``scored``, optionally
        ``engine_inflight``): the heartbeat's line."""
        ...


@runtime_checkable
class Trainer(Protocol):
    """One RL step on a TrainBatch (blocking: the loop runs it in a thread); a checkpoint; what
    the loop's :class:`pipeline.recovery.TrainerRecovery` needs to tell a lost rank and start the
    group again."""

    def train(self, batch: TrainBatch, loss_scale_factor: int | None = None) -> dict[str, float]: ...

    def save(self, directory: str) -> None: ...

    def actor_ids(self) -> set[str]:
        """The Ray actor ids of the ranks (an actor error naming one is a lost rank)."""
        ...

    def lost(self) -> bool:
        """Whether a rank does not answer (asked after another Ray error)."""
        ...

    def restart(self, resume_dir: str | None) -> None:
        """Every rank started again from the checkpoint ``resume_dir`` (None: the initial weights)."""
        ...


@runtime_checkable
class WeightPush(Protocol):
    """Sends the trainer's current weights to every sampler as ``version``; returns seconds.
    ``last_stats``: the last push's split in seconds (``transport_s``, ``load_s``, ``check_s``,
    ...; empty when it keeps none)."""
    last_stats: dict[str, float]

    async def push(self, version: int) -> float: ...


@runtime_checkable
class Logger(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_table(self, step: int, samples: list[Sample], decode: Any = None) -> None: ...

    def log_image(self, step: int, key: str, path: Path) -> None: ...

    def log_samples(self, samples: list[Sample]) -> None:
        """Every scored turn of a step (samples.jsonl)."""
        ...

    def rewind(self, step: int) -> None:
        """Steps from ``step`` on are logged again (a restarted trainer trains them again)."""
        ...


@dataclass
class GeneratedBatch:
    step: int
    version: int                     # what the samplers held when the batch started
    samples: list[Sample]
    t_start: float
    t_end: float
    last_token: float                # last generated token of the batch
    rollout: dict[str, float] = field(default_factory=dict)  # the sampler group's batch stats
    gen_wait: float = 0.0            # seconds the batch waited for a version within the bound

    @property
    def wall(self) -> float:
        return self.t_end - self.t_start

    @property
    def reward_tail(self) -> float:
        return max(0.0, self.t_end - self.last_token)


@dataclass
class LoopParts:
    """What the loop drives; built by pipeline.main (or a test: fakes satisfy the Protocols)."""

    samplers: Samplers               # SamplerGroup
    trainer: Trainer                 # TrainerGroup
    weight_push: WeightPush          # pipeline.weight_push.make_weight_push
    tasks: list[Any]                 # TaskRefs of the training split
    build_batch: Callable[[list[Sample], int], TrainBatch]  # (samples, step) -> its training rows
    rollout_metrics: Callable[[list[Sample]], dict[str, float]]
    response_length: Callable[[int], int]              # step -> max response length
    expected_samples: int            # per batch, for the progress bar
    logger: Logger                   # MetricsLogger
    run_dir: Path
    checkpoint_cfg: CheckpointConfig
    decode: Callable[[list[int]], str] = lambda ids: ""   # token ids -> text (episode table)
    timeline: Timeline = field(default_factory=Timeline)
