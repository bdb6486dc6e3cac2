"""k = 0 is the synchronous trainer and k = 1 the one-off one, exactly: the real parts in this
process (HF engine on the tiny Qwen2 with the toy env, a one-rank FSDP2 trainer on gloo, the
trainer's exported state dict pushed into the sampler), fixed seeds, 3 steps. The Loop under
max_staleness k gives the samples (token ids and sampler log-probs), the losses and the weights
that a plain loop written out here for each schedule gives, step by step. Ray only carries the
parts between processes in a run; the adapters below call the same methods in-process."""
from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest
import torch

from pipeline.algorithms import AlgorithmConfig, build_train_batch
from pipeline.loop import Loop, batch_tasks
from pipeline.loop_config import PipelineConfig
from pipeline.parts import LoopParts
from pipeline.models import ModelConfig, load_tokenizer
from pipeline.rollout import BatchStats
from pipeline.rollout_config import load_rollout_config
from pipeline.sampler_worker import SamplerWorker
from pipeline.trainer import TrainerConfig, TrainerWorker, plan_step
from pipeline.trainer.worker import BATCH_KEYS, free_port
from tests.pipeline.conftest import group

STEPS, TASKS = 3, 2


class LocalSamplers:
    def __init__(self, worker: SamplerWorker) -> None:
        self.w, self.last_stats = worker, BatchStats()

    async def progress(self):
        return [self.w.progress()]

    async def generate(self, step, tasks, version):
        async for item in self.w.generate(step, tasks, version):
            if isinstance(item, list):
                for s in item:
                    yield s
            else:
                self.last_stats = item


class LocalTrainer:
    """TrainerGroup.train's planning for one rank, without the actor hop."""

    def __init__(self, worker: TrainerWorker, algo: AlgorithmConfig) -> None:
        self.w, self.algo = worker, algo

    def train(self, batch, loss_scale_factor=None):
        lens = [int(x) for x in batch.attention_mask.sum(1)]
        plan = plan_step(lens, [int(x) for x in batch.response_mask.sum(1)], 1,
                         self.algo.ppo_mini_batches, self.algo.micro_batch_tokens)
        rows = torch.tensor(plan.ranks[0].rows)
        shard = {k: getattr(batch, k)[rows] for k in BATCH_KEYS}
        return self.w.train_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens,
                                 loss_scale_factor)

    def save(self, directory):
        self.w.save(directory)

    def actor_ids(self):
        return set()  # in this process: no actor of it is ever lost

    def lost(self):
        return False

    def restart(self, resume_dir):
        raise AssertionError("a trainer that is never lost is never restarted")


class LocalPush:
    """The object-store push's payload (the exported state dict) handed over directly; every
    pushed version's weights are kept for the comparison."""

    def __init__(self, trainer: TrainerWorker, sampler: SamplerWorker) -> None:
        self.t, self.s, self.weights = trainer, sampler, []
        self.last_stats: dict[str, float] = {}  # no split of its seconds

    async def push(self, version):
        sd = self.t.exported_state_dict()
        self.weights.append({k: v.clone() for k, v in sd.items()})
        await self.s.update_weights(list(sd.items()), version)
        return 0.0


def build(tmp_path):
    """Fresh parts from the same seeds."""
    random.seed(0)
    torch.manual_seed(0)
    model_cfg = group(ModelConfig, "model/tiny")
    algo = group(AlgorithmConfig, "algorithm/grpo", ppo_mini_batches=2, overlong_filter="off")
    rollout = load_rollout_config("hf", ["n_trajectories=4", "turns=1", "max_response_length=8",
                                         "temperature=1.0", "response_length_schedule=[]"])
    sampler = SamplerWorker(model_cfg, rollout, {"_target_": "rewards.toy.ToyEnv", "n_tasks": 4})
    sampler.engine._seeds.seed(1234)  # the engine draws each batch's sampling seed from here
    trainer = TrainerWorker(0, 1, model_cfg, group(TrainerConfig, "trainer/fsdp2", **{"optim.lr": 1e-2}),
                            algo, max_response_length=8, temperature=1.0, total_optim_steps=2 * STEPS)
    trainer.init("127.0.0.1", free_port())
    pad = load_tokenizer(model_cfg).pad_token_id
    parts = SimpleNamespace(
        sampler=sampler, trainer=trainer, samplers=LocalSamplers(sampler),
        local_trainer=LocalTrainer(trainer, algo), push=LocalPush(trainer, sampler),
        tasks=sampler.tasks("train"),
        build=lambda samples, step: build_train_batch(samples, algo, 8, pad))
    return parts


def close(parts):
    parts.trainer.shutdown()
    asyncio.run(parts.sampler.aclose())


def by_uid(samples):
    return {s.uid: (tuple(s.response_ids), tuple(s.logprobs), s.policy_version) for s in samples}


async def collect(parts, step, version):
    tasks = batch_tasks(parts.tasks, step, TASKS, 0, False)
    return [s async for s in parts.samplers.generate(step, tasks, version)]


async def reference(parts, k):
    """The two schedules as plain code: sync (generate, train, push) and one_off (train N while
    generating N+1, then push)."""
    samples, losses, version = [], [], 0
    nxt = await collect(parts, 0, 0) if k == 1 else None
    for step in range(STEPS):
        if k == 0:
            cur = await collect(parts, step, version)
            out = await asyncio.to_thread(parts.local_trainer.train, parts.build(cur, step), 8)
        else:
            cur = nxt
            out, nxt = await asyncio.gather(
                asyncio.to_thread(parts.local_trainer.train, parts.build(cur, step), 8),
                collect(parts, step + 1, version) if step + 1 < STEPS else asyncio.sleep(0))
        samples.append(by_uid(cur))
        losses.append(out["actor/loss"])
        version += 1
        await parts.push.push(version)
    return samples, losses, parts.push.weights


def with_loop(parts, k, tmp_path):
    cfg = PipelineConfig(mode=None, max_staleness=k, staleness_policy="drop", partial_rollout=False,
                         steps=STEPS, tasks_per_batch=TASKS, task_split="train", shuffle_tasks=False,
                         weight_push="object_store", initial_weight_push=False, progress=False,
                         heartbeat_s=0.0, seed=0)
    trained = []

    def build(samples, step):
        trained.append(by_uid(samples))
        return parts.build(samples, step)

    logger = SimpleNamespace(log=lambda *a: None, log_table=lambda *a: None, log_samples=lambda *a: None,
                             log_image=lambda *a: None,
                             rewind=lambda step: None)
    loop = Loop(cfg, LoopParts(
        samplers=parts.samplers, trainer=parts.local_trainer, weight_push=parts.push, tasks=parts.tasks,
        build_batch=build, rollout_metrics=lambda s: {}, response_length=lambda step: 8,
        expected_samples=8, logger=logger, run_dir=tmp_path,
        checkpoint_cfg=SimpleNamespace(every=0, at_end=False, dir="ckpt", keep_last=0)), 0)
    history = asyncio.run(loop.run())
    return trained, [h["actor/loss"] for h in history], parts.push.weights, history


@pytest.mark.parametrize("k", [0, 1])
def test_max_staleness_equals_the_old_schedule(tmp_path, k):
    parts = build(tmp_path)
    try:
        ref_samples, ref_losses, ref_weights = asyncio.run(reference(parts, k))
    finally:
        close(parts)
    parts = build(tmp_path)
    try:
        samples, losses, weights, history = with_loop(parts, k, tmp_path)
    finally:
        close(parts)
    assert len(samples) == len(ref_samples) == STEPS
    for step in range(STEPS):
        assert samples[step] == ref_samples[step], step       # same tokens, log-probs, versions
        assert losses[step] == ref_losses[step], step
        assert weights[step].keys() == ref_weights[step].keys()
        for name, w in weights[step].items():
            assert torch.equal(w, ref_weights[step][name]), (step, name)
    assert len({u for s in samples for u in s}) == STEPS * TASKS * 4  # distinct batches
    assert [h["pipeline/policy_lag"] for h in history] == [0.0] + [float(k)] * (STEPS - 1)
    assert all("rollout_corr/k3_kl" in h for h in history)
    if k == 0:  # the sampler holds the trainer's weights: only the engine's numerics differ
        assert history[0]["mismatch/abs_logprob_diff_max"] < 1e-3
