"""What a restarted trainer does to the schedule, with fake parts (no Ray, no model; the real
restart of a killed trainer actor is tests/reliability/test_trainer_restart.py): the steps after
the latest checkpoint are trained again with the very batches they trained before (none
regenerated, none lost), each step is logged once, the samplers get the restored version, and a
loss past ``pipeline.max_trainer_restarts`` is raised. Claims only the schedule."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ray.exceptions import RayActorError

from tests.pipeline.test_loop_schedule import FakeTrainer, gen_versions, make


class LosingTrainer(FakeTrainer):
    """Its rank is 'lost' (a Ray actor error naming one of its actor ids) when asked to train the
    steps in ``lose_at``, once each; ``restart`` starts a new rank from a checkpoint."""

    def __init__(self, lose_at: list[int], in_save: bool = False) -> None:
        super().__init__(0.005)
        self.lose_at, self.in_save = list(lose_at), in_save
        self.rank, self.restarted_from = 0, []
        self.steps: list[int] = []

    def actor_ids(self) -> set[str]:
        return {f"rank-{self.rank}"}

    def _maybe_lose(self, step: int) -> None:
        if self.lose_at and self.lose_at[0] == step:
            self.lose_at.pop(0)
            raise RayActorError(actor_id=f"rank-{self.rank}", error_msg="killed by the test")

    def train(self, batch, loss_scale_factor=None):
        if not self.in_save:
            self._maybe_lose(batch.step)
        self.steps.append(batch.step)
        return super().train(batch, loss_scale_factor)

    def save(self, directory: str) -> None:
        if self.in_save:
            self._maybe_lose(int(Path(directory).name.split("_")[-2]))
        super().save(directory)

    def restart(self, resume_dir: str | None) -> None:
        self.rank += 1
        self.restarted_from.append(resume_dir and Path(resume_dir).name)


def run_losing(tmp_path, k, lose_at, in_save=False, restarts=3, steps=7, every=2):
    loop, samplers, _ = make(tmp_path, k, steps=steps, max_trainer_restarts=restarts, every=every)
    trainer = LosingTrainer(lose_at, in_save)
    trainer.loop = loop
    loop.parts.trainer = trainer
    history = asyncio.run(loop.run())
    return loop, trainer, history


@pytest.mark.parametrize("k", [0, 1, 3])
def test_steps_after_the_checkpoint_are_trained_again_with_their_own_batches(tmp_path, k):
    # checkpoints after steps 1, 3, 5; the rank is lost when asked to train step 3 (step 2 was
    # trained since the checkpoint of step 1) and step 6 (nothing trained since that of step 5)
    loop, trainer, history = run_losing(tmp_path, k, lose_at=[3, 6])
    assert [h["step"] for h in history] == list(range(7))  # each step logged once
    assert trainer.restarted_from == ["step_000001", "step_000005"]
    assert [h["pipeline/trainer_restarts"] for h in history] == [0, 0, 1, 1, 1, 1, 2]
    # step 2 was trained, then lost with the rank at step 3: both trained from the checkpoint
    # of step 1 again; step 6 redone from the checkpoint of step 5 (nothing since it)
    assert trainer.steps == [0, 1, 2, 2, 3, 4, 5, 6]
    first, again = trainer.batches[2], trainer.batches[3]
    assert first == again  # the same samples, not a regenerated batch
    generated = [b for what, b, _ in loop.events if what == "gen"]
    assert sorted(generated) == list(range(7))  # every batch generated once, restarts or not
    trained_last = {}  # what the final weights hold: each step's last training
    for step, uids in zip(trainer.steps, trainer.batches):
        trained_last[step] = uids
    uids = [u for b in range(7) for u in trained_last[b]]
    assert len(uids) == len(set(uids)) == 7 * 2 * 2  # no sample lost, none twice
    # the samplers got the restored version before training went on
    ev = loop.events
    r = ev.index(("restart", 3, 2))
    assert ("push", 2, 1) in ev[r:] and ev.index(("push", 2, 1), r) < ev.index(("train", 2, 2), r)
    assert gen_versions(loop) == {b: max(0, b - k) for b in range(7)}


def test_a_rank_lost_while_it_writes_the_checkpoint_redoes_from_the_one_before(tmp_path):
    loop, trainer, history = run_losing(tmp_path, 1, lose_at=[3], in_save=True)
    assert [h["step"] for h in history] == list(range(7))
    assert trainer.restarted_from == ["step_000001"]
    assert trainer.steps == [0, 1, 2, 3, 2, 3, 4, 5, 6]
    assert trainer.batches[2:4] == trainer.batches[4:6]


def test_a_loss_past_the_bound_stops_the_run(tmp_path):
    with pytest.raises(RayActorError):
        run_losing(tmp_path, 1, lose_at=[2, 4], restarts=1)
    with pytest.raises(RayActorError):
        run_losing(tmp_path / "none", 1, lose_at=[2], restarts=0)


def test_a_rank_lost_after_a_stop_request_is_not_restarted(tmp_path, capsys):
    # a SIGTERM to the job's process group reaches the ranks too: the loop saw the stop request,
    # then lost the trainer; restarting it would only spend the grace period of a job being stopped
    loop, samplers, _ = make(tmp_path, 1, steps=7, max_trainer_restarts=3, every=2)
    trainer = LosingTrainer([3])
    trainer.loop = loop
    loop.parts.trainer = trainer
    real_train = trainer.train

    def stop_then_train(batch, loss_scale_factor=None):
        if batch.step == 3:
            loop.stop_requested = True
        return real_train(batch, loss_scale_factor)

    trainer.train = stop_then_train
    with pytest.raises(RayActorError):
        asyncio.run(loop.run())
    assert trainer.restarted_from == []
    assert "after a stop was requested" in capsys.readouterr().err


def test_another_actors_error_is_not_a_trainer_restart(tmp_path):
    loop, samplers, _ = make(tmp_path, 1, steps=3, max_trainer_restarts=3)
    trainer = LosingTrainer([])
    loop.parts.trainer = trainer

    def lost_sampler(batch, loss_scale_factor=None):
        raise RayActorError(actor_id="a-sampler", error_msg="not the trainer's")

    trainer.train = lost_sampler
    with pytest.raises(RayActorError):
        asyncio.run(loop.run())
    assert trainer.restarted_from == []


def test_a_batch_whose_weights_are_gone_is_generated_again_after_the_next_push(tmp_path):
    """A replacement sampler could not fetch the last weights (their owner, the lost trainer rank,
    took them along): that batch's samples are dropped and it is generated again after a push."""
    from pipeline.parts import WeightsGone

    loop, samplers, trainer = make(tmp_path, 1, steps=4)
    generate = samplers.generate
    failed = []

    async def once_gone(step, tasks, version):
        if step == 2 and not failed:
            failed.append(version)
            async for s in generate(step, tasks, version):
                yield s
                raise WeightsGone("the test's")
        async for s in generate(step, tasks, version):
            yield s

    samplers.generate = once_gone
    history = asyncio.run(loop.run())
    assert [h["step"] for h in history] == list(range(4)) and failed == [1]
    gens = [(b, v) for what, b, v in loop.events if what == "gen"]
    assert gens.count((2, 1)) == 1 and (2, 2) in gens  # made again with the version pushed next
    assert sum(h["perf/samples"] for h in history) == 4 * 2 * 2
