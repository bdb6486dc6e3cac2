"""The step loop's schedule under max_staleness k = 0, 1, 3 with fake parts (no Ray, no model): which
weights version each batch was generated with, when pushes happen, what a checkpoint carries over
and that a resumed loop neither regenerates nor loses it, partial rollouts on and off, and the
drop/wait policy for samples over the bound. Claims only the schedule: the parts are fakes."""
from __future__ import annotations

import asyncio
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pipeline.loop import Loop
from pipeline.loop_config import PipelineConfig
from pipeline.parts import LoopParts
from pipeline.parts import Logger, Samplers, Trainer, WeightPush
from pipeline.rollout import BatchStats
from pipeline.sample import Sample
from pipeline.staleness import MismatchStats, lag_metrics, resolve_staleness


@dataclass
class Task:
    task_id: str


class FakeSamplers:
    """Turns of ``turns`` per trajectory; each turn is generated under a lock, as the HF engine's
    batch holds its lock, so a push lands between turns, never inside one."""

    def __init__(self, turns: int = 1, turn_s: float = 0.0, n_traj: int = 2) -> None:
        self.held, self.turns, self.turn_s, self.n_traj = 0, turns, turn_s, n_traj
        self.lock = asyncio.Lock()
        self.stale_once: set[str] = set()  # task ids whose next batch comes from an old worker
        self.last_stats, self.generated = BatchStats(), 0

    async def progress(self):
        return [{"generated": self.generated, "scored": self.generated}]

    async def generate(self, step, tasks, version):
        self.last_stats, self.generated = BatchStats(step=step, n_tasks=len(tasks)), 0
        for t in tasks:
            old = t.task_id in self.stale_once
            self.stale_once.discard(t.task_id)
            for traj in range(self.n_traj):
                for turn in range(self.turns):
                    async with self.lock:
                        await asyncio.sleep(self.turn_s)
                        v = -5 if old else self.held  # a replaced worker's initial weights
                    self.generated += 1
                    yield Sample(uid=f"{step}/{t.task_id}/{traj}/{turn}", step=step, task_id=t.task_id,
                                 traj=traj, turn=turn, prompt_ids=[1], response_ids=[2, 3],
                                 logprobs=[-1.0, -1.0], finish_reason="stop", score=float(traj),
                                 policy_version=v)
        self.last_stats.n_samples = self.generated


class FakeSync:
    def __init__(self, samplers: FakeSamplers) -> None:
        self.s = samplers
        self.last_stats: dict[str, float] = {}  # no split of its seconds

    async def push(self, version: int) -> float:
        async with self.s.lock:  # waits for the turn in flight to end
            self.s.held = version
        return 0.0


class FakeTrainer:
    def __init__(self, train_s: float, stop_at: int | None = None) -> None:
        self.train_s, self.stop_at, self.loop = train_s, stop_at, None
        self.batches: list[list[str]] = []

    def train(self, batch, loss_scale_factor=None):
        time.sleep(self.train_s)
        self.batches.append([s.uid for s in batch.samples])
        if self.stop_at is not None and batch.step == self.stop_at:
            self.loop.request_stop()
        return {"actor/loss": float(len(batch.samples))}

    def save(self, directory: str) -> None:
        Path(directory, "model").mkdir()

    def actor_ids(self) -> set[str]:
        return set()  # in this process: no actor of it is ever lost

    def lost(self) -> bool:
        return False

    def restart(self, resume_dir: str | None) -> None:
        raise AssertionError("a trainer that is never lost is never restarted")


class FakeLogger:
    def __init__(self) -> None:
        self.lines: list[dict] = []

    def log(self, step, metrics):
        self.lines.append({"step": step, **metrics})

    def log_table(self, step, samples, decode=None):
        pass

    def log_samples(self, samples):
        pass

    def log_image(self, step, key, path):
        pass

    def rewind(self, step):
        self.lines = [line for line in self.lines if line["step"] < step]


def make(tmp_path, k, steps=6, train_s=0.02, turns=1, turn_s=0.0, partial=False, policy="drop",
         stop_at=None, start_step=0, version=0, pending=None, max_trainer_restarts=0, every=0,
         heartbeat_s=0.0):
    cfg = PipelineConfig(mode=None, max_staleness=k, staleness_policy=policy, partial_rollout=partial,
                         steps=steps, tasks_per_batch=2, task_split="train", shuffle_tasks=False,
                         weight_push="object_store", initial_weight_push=False, progress=False,
                         heartbeat_s=heartbeat_s, seed=0, max_trainer_restarts=max_trainer_restarts)
    samplers = FakeSamplers(turns, turn_s)
    samplers.held = version
    trainer = FakeTrainer(train_s, stop_at)
    parts = LoopParts(
        samplers=samplers, trainer=trainer, weight_push=FakeSync(samplers),
        tasks=[Task(f"t{i}") for i in range(4)],
        build_batch=lambda s, step: SimpleNamespace(input_ids=torch.zeros(len(s), 1), samples=s,
                                                    step=step, metrics={}),
        rollout_metrics=lambda s: {}, response_length=lambda step: 8, expected_samples=4,
        logger=FakeLogger(), run_dir=tmp_path,
        checkpoint_cfg=SimpleNamespace(every=every, at_end=False, dir="ckpt", keep_last=0))
    loop = Loop(cfg, parts, timeline_every=0, start_step=start_step, version=version, pending=pending)
    trainer.loop = loop
    return loop, samplers, trainer


def test_a_quiet_log_says_what_each_part_is_doing(tmp_path, capsys):
    """Bars off: a step longer than heartbeat_s gets a line naming the trainer's batch and how
    long it has trained, and the sampler generating the next batch beside it (one_off); none
    with heartbeat_s=0."""
    loop, _, _ = make(tmp_path, 1, steps=2, train_s=0.5, turn_s=0.1, heartbeat_s=0.1)
    asyncio.run(loop.run())
    beats = [l for l in capsys.readouterr().err.splitlines() if l.startswith("[pipeline] sampler:")]
    assert any("trainer: training batch 0 for" in l for l in beats), beats
    assert any("sampler: generating batch 1 for" in l for l in beats), beats
    (tmp_path / "off").mkdir()
    loop, _, _ = make(tmp_path / "off", 1, steps=2, train_s=0.5, heartbeat_s=0.0)
    asyncio.run(loop.run())
    assert "[pipeline] sampler:" not in capsys.readouterr().err


def gen_versions(loop):
    return {b: v for what, b, v in loop.events if what == "gen"}


def test_parts_satisfy_the_protocols(tmp_path):
    loop, _, _ = make(tmp_path, 1)
    p = loop.parts
    assert isinstance(p.samplers, Samplers) and isinstance(p.trainer, Trainer)
    assert isinstance(p.weight_push, WeightPush) and isinstance(p.logger, Logger)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_batch_b_is_generated_with_version_b_minus_k(tmp_path, k):
    loop, _, trainer = make(tmp_path, k)  # generation is instant, training takes 20 ms
    history = asyncio.run(loop.run())
    steps = 6
    assert gen_versions(loop) == {b: max(0, b - k) for b in range(steps)}
    trains = [(b, v) for what, b, v in loop.events if what == "train"]
    assert trains == [(b, b) for b in range(steps)]  # batch b trained by version b
    assert [e for e in loop.events if e[0] == "push"] == [("push", b + 1, b) for b in range(steps)]
    for b, h in enumerate(history):
        assert h["pipeline/policy_lag"] == min(b, k) == h["pipeline/policy_lag_max"]
        assert h[f"pipeline/policy_lag_hist/{min(b, k)}"] == 1.0
        assert h["staleness/dropped_samples"] == 0.0
    if k == 0:  # sync: generate b, train b, push b+1, in that order, nothing overlapping
        expect = []
        for b in range(steps):
            expect += [("gen", b, b), ("gen_done", b, b), ("train", b, b), ("push", b + 1, b)]
        assert loop.events == expect
    else:
        ev = loop.events
        for b in range(steps):  # the push of version b+1 comes between training b and b+1
            after = ev.index(("train", b + 1, b + 1)) if b + 1 < steps else len(ev)
            assert ev.index(("train", b, b)) < ev.index(("push", b + 1, b)) < after
        for b in range(k + 1, steps):  # batch b starts right after version b-k was pushed
            assert ev.index(("push", b - k, b - k - 1)) < ev.index(("gen", b, b - k))


def test_one_off_push_waits_for_the_batch_in_flight(tmp_path):
    """k = 1 without partial rollouts: training is fast, generation slow; the push after step b waits
    until batch b+1 is generated, so each batch is made by one version (today's one_off)."""
    loop, _, _ = make(tmp_path, 1, train_s=0.0, turns=2, turn_s=0.01)
    history = asyncio.run(loop.run())
    ev = loop.events
    for b in range(5):
        assert ev.index(("gen_done", b + 1, b)) < ev.index(("push", b + 1, b))
    assert all(h["pipeline/mixed_version_trajectories"] == 0 for h in history)


def test_partial_rollout_push_lands_between_turns(tmp_path):
    """partial_rollout=true: the push reaches the samplers mid-batch; the turn in flight ends with
    the old weights and the trajectory's next turns carry the new version."""
    loop, _, trainer = make(tmp_path, 1, steps=4, train_s=0.0, turns=3, turn_s=0.01, partial=True)
    history = asyncio.run(loop.run())
    ev = loop.events
    assert ev.index(("push", 1, 0)) < ev.index(("gen_done", 1, 0))
    mixed = sum(h["pipeline/mixed_version_trajectories"] for h in history)
    assert mixed > 0
    for h in history[1:]:
        assert h["pipeline/policy_lag_max"] <= 1  # newer turns only lower the lag


@pytest.mark.parametrize("k", [0, 1, 3])
def test_resume_carries_the_pending_batches(tmp_path, k):
    loop, _, _ = make(tmp_path, k, steps=8, stop_at=2)
    asyncio.run(loop.run())
    assert [e for e in loop.events if e[0] == "checkpoint"] == [("checkpoint", 2, 3)]
    state = pickle.loads((tmp_path / "ckpt" / "step_000002" / "loop.pt").read_bytes())
    pending = state["pending"] or []
    carried = sorted({s.step for s in pending})
    assert carried == list(range(3, 3 + k))  # the batches generated ahead, none in flight
    assert all(s.policy_version == max(0, s.step - k) for s in pending)
    again, _, trainer = make(tmp_path, k, steps=8, start_step=3, version=3, pending=state["pending"])
    history = asyncio.run(again.run())
    assert [h["step"] for h in history] == list(range(3, 8))
    generated = sorted(gen_versions(again))
    assert generated == [b for b in range(3, 8) if b not in carried]  # none generated twice
    assert gen_versions(again) == {b: max(3, b - k) for b in generated}
    first = {uid for uid in trainer.batches[0]}
    assert first == {s.uid for s in pending if s.step == 3} or k == 0


@pytest.mark.parametrize("policy", ["drop", "wait"])
def test_samples_over_the_bound_are_dropped_or_regenerated(tmp_path, policy):
    loop, samplers, trainer = make(tmp_path, 1, steps=3, policy=policy)
    samplers.stale_once = {"t2"}  # batch 1 = tasks t2, t3: t2 comes from a worker with old weights
    history = asyncio.run(loop.run())
    h = history[1]
    if policy == "drop":
        assert h["staleness/dropped_samples"] == 2 and h["staleness/waited_samples"] == 0
        assert all("/t2/" not in uid for uid in trainer.batches[1])
    else:
        assert h["staleness/waited_samples"] == 2 and h["staleness/dropped_samples"] == 0
        assert sum("/t2/" in uid for uid in trainer.batches[1]) == 2  # generated again
    assert h["pipeline/policy_lag_max"] <= 1


def test_staleness_aliases_and_errors():
    assert resolve_staleness("sync", 1) == 0 and resolve_staleness("one_off", 1) == 1
    assert resolve_staleness(None, 3) == 3 and resolve_staleness("sync", 0) == 0
    with pytest.raises(ValueError, match="keep one of them"):
        resolve_staleness("sync", 3)
    with pytest.raises(ValueError, match="pipeline.max_staleness=-1"):
        resolve_staleness(None, -1)


def test_lag_histogram_and_mismatch_numbers():
    s = [Sample(uid=str(i), step=0, task_id="t", traj=i, turn=0, prompt_ids=[], response_ids=[],
                logprobs=[], finish_reason="stop", score=0.0, policy_version=v)
         for i, v in enumerate([5, 4, 4, 1])]
    m = lag_metrics(s, 5, 2)
    assert m["pipeline/policy_lag"] == (0 + 1 + 1 + 4) / 4 and m["pipeline/policy_lag_max"] == 4
    assert (m["pipeline/policy_lag_hist/0"], m["pipeline/policy_lag_hist/1"],
            m["pipeline/policy_lag_hist/2"], m["pipeline/policy_lag_hist/gt2"]) == (0.25, 0.5, 0.0, 0.25)
    acc = MismatchStats()
    trainer = torch.tensor([[-1.0, -2.0, -9.0]])
    sampler = torch.tensor([[-1.5, -1.0, 0.0]])
    acc.add(trainer, sampler, torch.tensor([[1.0, 1.0, 0.0]]))
    out = MismatchStats.metrics(acc.as_vector(), acc.abs_max)
    assert out["rollout_corr/kl"] == pytest.approx((-0.5 + 1.0) / 2)
    assert out["mismatch/abs_logprob_diff_mean"] == pytest.approx(0.75)
    assert out["mismatch/abs_logprob_diff_max"] == pytest.approx(1.0)
    r = torch.exp(torch.tensor([0.5, -1.0]))
    assert out["rollout_corr/k3_kl"] == pytest.approx(float((r - torch.log(r) - 1).mean()))


@pytest.mark.parametrize("overrides, named", [
    (["pipeline.max_staleness=-1"], "pipeline.max_staleness=-1"),
    (["pipeline.mode=sync", "pipeline.max_staleness=3"], "keep one of them"),
    (["pipeline.staleness_policy=skip"], "pipeline.staleness_policy='skip'"),
])
def test_config_check_names_the_staleness_keys(overrides, named):
    from pipeline.config import check
    from tests.pipeline.test_e2e import config

    with pytest.raises(ValueError, match=named):
        check(config("+experiment=toy", *overrides))
    check(config("+experiment=toy", "pipeline.mode=sync"))  # the alias alone is fine


def test_the_samplers_batch_stats_are_logged_with_the_step_that_trains_the_batch(tmp_path):
    loop, _, trainer = make(tmp_path, 1, steps=3)
    history = asyncio.run(loop.run())
    assert [h["rollout/samples"] for h in history] == [4.0, 4.0, 4.0]  # 2 tasks x 2 trajectories
    assert [len(b) for b in trainer.batches] == [4, 4, 4]


def test_the_real_parts_have_every_member_their_protocol_declares():
    """What the loop calls on the real parts (the fakes above satisfy the Protocols by
    construction): a member renamed on one side fails here, not in a run's restart path."""
    import inspect

    from pipeline.metrics import MetricsLogger
    from pipeline.sampler import SamplerGroup
    from pipeline.trainer import TrainerGroup

    for protocol, real in ((Samplers, SamplerGroup), (Trainer, TrainerGroup), (Logger, MetricsLogger)):
        methods = [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]
        fields = list(protocol.__annotations__)
        assert methods, protocol
        for name in methods:
            assert callable(getattr(real, name, None)), f"{real.__name__} has no {name}()"
            declared = inspect.signature(getattr(protocol, name)).parameters
            have = inspect.signature(getattr(real, name)).parameters
            assert list(declared) == list(have)[:len(declared)], (real.__name__, name)
        for name in fields:  # data members are set on the instance
            assert f"self.{name} =" in inspect.getsource(real), f"{real.__name__} sets no {name}"


class TwiceStoppingTrainer(FakeTrainer):
    """Its step 2 brings the stop request twice at once, as one SIGTERM reaches a driver that
    coreutils ``timeout`` signals both directly and through its process group."""

    def train(self, batch, loss_scale_factor=None):
        out = super().train(batch, loss_scale_factor)
        if batch.step == 2:
            self.loop.request_stop()
        return out


@pytest.mark.parametrize("apart_s", [None, 0.0])
def test_one_stop_request_delivered_twice_still_finishes_the_step_and_checkpoints(tmp_path, monkeypatch, apart_s):
    import pipeline.loop as loop_module

    if apart_s is not None:  # two requests further apart than SAME_STOP_S: the second abandons the step
        monkeypatch.setattr(loop_module, "SAME_STOP_S", apart_s)
    loop, _, trainer = make(tmp_path, 1, steps=8)
    twice = TwiceStoppingTrainer(trainer.train_s, stop_at=2)
    twice.loop, loop.parts.trainer = loop, twice
    if apart_s is None:
        asyncio.run(loop.run())
        assert [e for e in loop.events if e[0] == "checkpoint"] == [("checkpoint", 2, 3)]
    else:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(loop.run())
        assert not [e for e in loop.events if e[0] == "checkpoint"]


def test_a_stop_does_not_wait_for_the_batch_in_flight(tmp_path):
    """one_off: the stop comes while batch 1 is being generated (a slow tail, as a build running to
    the compile timeout). Step 0 is logged and checkpointed without waiting for it and without a
    push; batch 1 is not carried, and the resumed run generates it again with the checkpoint's
    weights."""
    loop, _, _ = make(tmp_path, 1, steps=4, turns=2, turn_s=0.3, stop_at=0)
    t0 = time.monotonic()
    asyncio.run(loop.run())
    took = time.monotonic() - t0
    ev = loop.events
    assert ("checkpoint", 0, 1) in ev
    assert ("gen_done", 1, 0) not in ev[:ev.index(("checkpoint", 0, 1))]
    assert not [e for e in ev if e[0] == "push"]
    assert [line["step"] for line in loop.parts.logger.lines] == [0]
    assert took < 2 * 8 * 0.3  # batch 0 alone (8 turns), not batch 1's as well
    state = pickle.loads((tmp_path / "ckpt" / "step_000000" / "loop.pt").read_bytes())
    assert state["cursor"] == 1 and state["version"] == 1 and not state["pending"]
    again, _, trainer = make(tmp_path, 1, steps=2, start_step=1, version=1, pending=state["pending"])
    asyncio.run(again.run())
    assert gen_versions(again) == {1: 1}
    assert len(trainer.batches) == 1


@pytest.mark.parametrize("every", [0, 1])
def test_a_stop_while_a_batch_is_generated_checkpoints_the_step_before(tmp_path, capsys, every):
    """sync: the stop comes while batch 1 is generated (the trainer waits for it). The run stops
    without waiting for that batch; step 0 is checkpointed (once: with checkpoint.every=1 it
    already is) and the resumed run generates batch 1 again."""
    import threading

    loop, _, trainer = make(tmp_path, 0, steps=4, turns=2, turn_s=0.3, every=every)
    threading.Timer(8 * 0.3 + 0.6, loop.request_stop).start()  # batch 0 is 8 turns of 0.3 s
    t0 = time.monotonic()
    asyncio.run(loop.run())
    assert time.monotonic() - t0 < 2 * 8 * 0.3
    assert len(trainer.batches) == 1 and ("gen_done", 1, 1) not in loop.events
    assert [e for e in loop.events if e[0] == "checkpoint"] == [("checkpoint", 0, 1)]
    assert "stopped after step 0; checkpoint written: the same command continues at step 1" in capsys.readouterr().err
    state = pickle.loads((tmp_path / "ckpt" / "step_000000" / "loop.pt").read_bytes())
    assert state["cursor"] == 1 and not state["pending"]


def test_a_stop_before_the_first_batch_is_generated_trains_and_writes_nothing(tmp_path, capsys):
    import threading

    loop, _, trainer = make(tmp_path, 1, steps=4, turns=2, turn_s=0.3)
    threading.Timer(0.5, loop.request_stop).start()
    asyncio.run(loop.run())
    assert trainer.batches == [] and not [e for e in loop.events if e[0] == "checkpoint"]
    assert "stopped before step 0, nothing trained in this run" in capsys.readouterr().err
