"""A sampler SIGKILLed at a given moment (while it loads a weight push, while it scores a sample,
between steps) is replaced in its bundle and brought to the current weights; the step completes
with every trajectory exactly once. The moment is made certain, not hoped for: a hook inside the
worker writes its pid to a file and waits there until the test kills it (only the first worker
to reach it waits; the replacement passes). Real local Ray, tiny Qwen2, HF engine on CPU, ToyEnv.
The moment "while it generates" is tests/reliability/test_sampler_restart.py."""
import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from pipeline.models import load_model_and_tokenizer, load_model_config
from pipeline.sampler import SamplerPool
from pipeline.weight_sync import ObjectStoreWeights, checksums
from rewards.toy import ToyEnv
from tests.sampling.conftest import rollout_cfg

TRAJ = 2


def _hold_once(marker: str) -> None:
    """The first process here writes its pid to ``marker`` and waits to be killed."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    while True:
        time.sleep(0.05)


class HeldWeights(ObjectStoreWeights):
    """Object-store weights whose first receiver stops inside the push, before any tensor."""

    def __init__(self, inner: ObjectStoreWeights, marker: str) -> None:
        super().__init__(inner.version, inner.buckets, inner.checksums, inner.timings)
        self.marker = marker

    def tensors(self, receiver):
        _hold_once(self.marker)
        yield from super().tensors(receiver)


class HoldingEnv:
    """ToyEnv whose first evaluation (in any worker) stops while it scores."""
    per_worker = True

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, worker_index: int) -> ToyEnv:
        env = ToyEnv(n_tasks=4)
        evaluate, marker = env.evaluate, self.marker

        async def held(task, response):
            await asyncio.to_thread(_hold_once, marker)
            return await evaluate(task, response)

        env.evaluate = held
        return env


async def _kill_when_held(marker: Path, timeout_s: float = 120.0) -> int:
    t0 = time.time()
    while not (marker.exists() and marker.read_text()):
        assert time.time() - t0 < timeout_s, f"no worker reached the hook ({marker})"
        await asyncio.sleep(0.05)
    pid = int(marker.read_text())
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.fixture(scope="module")
def weights(ray_local):
    """A push of version 1: the tiny model's weights, changed so that loading them shows."""
    cfg = load_model_config("tiny")
    model, _ = load_model_and_tokenizer(cfg)
    with torch.no_grad():
        named = [(n, (t + 0.01).contiguous()) for n, t in model.state_dict().items()]
    return ObjectStoreWeights(1, [ray_local.put(named)], checksums(named))


def _pool(env, n=2) -> SamplerPool:
    return SamplerPool(load_model_config("tiny"), rollout_cfg(n_trajectories=TRAJ, turns=1), env,
                       n_workers=n, num_cpus=1)


def _assert_whole(samples, tasks) -> None:
    keys = [(s.task_id, s.traj) for s in samples]
    assert len(keys) == len(set(keys)), "a trajectory counted twice"
    assert set(keys) == {(t.task_id, j) for t in tasks for j in range(TRAJ)}, "a trajectory lost"
    assert len({s.uid for s in samples}) == len(samples)


async def test_sampler_killed_while_loading_a_push_is_replaced_and_loads_it(ray_local, weights, tmp_path):
    pool = _pool({"_target_": "rewards.toy.ToyEnv", "n_tasks": 4})
    try:
        marker = tmp_path / "held"
        pids = {p["pid"] for p in await pool.ping()}
        push = asyncio.ensure_future(pool.receive_weights(HeldWeights(weights, str(marker)), 1))
        killed = await _kill_when_held(marker)
        reports = await asyncio.wait_for(push, 300)
        assert killed in pids and pool.restarts == 1
        # every worker, the replacement included, holds version 1 and its checksums match
        assert [r["version"] for r in reports] == [1, 1]
        assert all(r["checked"] > 0 and not r["problems"] for r in reports), reports
        assert killed not in {p["pid"] for p in await pool.ping()}
        assert [p["version"] for p in await pool.ping()] == [1, 1]
        tasks = await pool.tasks("train")
        samples = [s async for s in pool.generate(0, tasks, 1)]
        _assert_whole(samples, tasks)
    finally:
        pool.shutdown()


async def test_sampler_killed_while_scoring_is_replaced_at_the_current_weights(ray_local, weights, tmp_path):
    marker = tmp_path / "held"
    pool = _pool(HoldingEnv(str(marker)))
    try:
        await pool.receive_weights(weights, 1)
        tasks = await pool.tasks("train")
        gen = asyncio.ensure_future(_collect(pool.generate(0, tasks, 1)))
        await _kill_when_held(marker)
        samples = await asyncio.wait_for(gen, 300)
        assert pool.restarts == 1
        _assert_whole(samples, tasks)
        assert any("replaced" in f for f in pool.last_stats.failures)
        assert [p["version"] for p in await pool.ping()] == [1, 1]  # the replay reached it
    finally:
        pool.shutdown()


async def test_sampler_killed_between_steps_is_replaced_at_the_next_step(ray_local, weights):
    pool = _pool({"_target_": "rewards.toy.ToyEnv", "n_tasks": 4})
    try:
        await pool.receive_weights(weights, 1)
        tasks = await pool.tasks("train")
        os.kill((await pool.ping())[1]["pid"], signal.SIGKILL)  # idle: no call is under way
        samples = await asyncio.wait_for(_collect(pool.generate(0, tasks, 1)), 300)
        _assert_whole(samples, tasks)
        assert pool.restarts == 1
        assert [p["version"] for p in await pool.ping()] == [1, 1]
    finally:
        pool.shutdown()


async def _collect(stream):
    return [s async for s in stream]
