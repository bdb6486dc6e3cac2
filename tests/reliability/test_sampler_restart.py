"""A sampler actor killed mid-step (ray.kill) is replaced in its bundle; its tasks are generated
again; the step completes; no uid is delivered twice and no trajectory vanishes: one that had
already handed on samples keeps exactly those (a prefix of its turns), the others come back whole.
Real local Ray, tiny Qwen2, HF engine on CPU, ToyEnv."""
import asyncio
from collections import defaultdict

import pytest

from pipeline.models import load_model_config
from pipeline.sampler import SamplerGroup
from tests.pipeline.conftest import rollout_cfg

TOY = {"_target_": "rewards.toy.ToyEnv", "n_tasks": 4, "delay_s": 0.3}
TRAJ, TURNS = 3, 2


@pytest.fixture(scope="module")
def ray_local():
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    if started:
        ray.shutdown()


async def test_killed_sampler_is_replaced_and_the_step_completes(ray_local):
    ray = ray_local
    pool = SamplerGroup(load_model_config("tiny"), rollout_cfg(n_trajectories=TRAJ, turns=TURNS, stream_buffer=2),
                        TOY, n_workers=2, num_cpus=1)
    try:
        tasks = await pool.tasks("train")
        victim = pool.workers[0]
        victim_tasks = {t.task_id for t in pool.split(tasks)[0]}
        samples, killed = [], False
        async for s in pool.generate(3, tasks, 0):
            samples.append(s)
            if not killed and s.task_id in victim_tasks:
                ray.kill(victim)  # mid-step: this worker's other trajectories are still running
                killed = True
        assert killed and pool.restarts == 1 and pool.workers[0] is not victim
        uids = [s.uid for s in samples]
        assert len(uids) == len(set(uids))  # nothing counted twice
        turns = defaultdict(list)
        for s in samples:
            turns[(s.task_id, s.traj)].append(s.turn)
        assert set(turns) == {(t.task_id, j) for t in tasks for j in range(TRAJ)}  # none vanished
        for key, ts in turns.items():
            assert sorted(ts) == list(range(len(ts))), (key, ts)  # each a prefix of its turns
        whole = [k for k, ts in turns.items() if len(ts) == TURNS]
        assert len(whole) >= len(turns) - 2 * len(victim_tasks)
        assert any("replaced" in f for f in pool.last_stats.failures), pool.last_stats.failures
        # the lost worker's stats died with it: the replacement's plus the other worker's remain
        assert pool.last_stats.n_samples <= len(samples)
        # the replacement serves the next step like any worker
        again = [s async for s in pool.generate(4, tasks, 0)]
        assert len(again) == len(tasks) * TRAJ * TURNS and all(s.error is None for s in again)
    finally:
        pool.shutdown()
