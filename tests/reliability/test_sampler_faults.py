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
from pipeline.sampler import SamplerGroup
from pipeline.weight_push import ObjectStoreWeights, checksums
from rewards.toy import ToyEnv
from tests.pipeline.conftest import rollout_cfg

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

    def tensors(self, state):
        _hold_once(self.marker)
        yield from super().tensors(state)


class HoldingEnv:
    """ToyEnv whose first evaluation (in any worker) after ``<dir>/armed`` appears stops while it
    scores (waiting in ``<dir>/held``); with ``<dir>/armed_start``, the first worker stops while it
    is built (``<dir>/start_held``)."""
    per_worker = True

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def __call__(self, worker_index: int) -> ToyEnv:
        if (self.folder / "armed_start").exists():  # the first worker stops while it starts
            _hold_once(str(self.folder / "start_held"))
        env = ToyEnv(n_tasks=4)
        evaluate, folder = env.score, self.folder

        async def held(task, response):
            if (folder / "armed").exists():
                await asyncio.to_thread(_hold_once, str(folder / "held"))
            return await evaluate(task, response)

        env.score = held
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


@pytest.fixture(scope="module")
def pool(ray_local, tmp_path_factory):
    """Two workers for the three tests below, in order (a pool costs ~20 s to start here)."""
    import threading

    folder = tmp_path_factory.mktemp("hold")
    (folder / "armed_start").touch()
    killed: list[int] = []
    killer = threading.Thread(target=lambda: killed.append(asyncio.run(_kill_when_held(folder / "start_held"))))
    killer.start()
    pool = SamplerGroup(load_model_config("tiny"), rollout_cfg(n_trajectories=TRAJ, turns=1),
                        HoldingEnv(str(folder)), n_workers=2, num_cpus=1)
    killer.join()
    (folder / "armed_start").unlink()
    pool.hold_dir, pool.killed_at_start = folder, killed[0]
    yield pool
    pool.shutdown()


def _assert_whole(samples, tasks) -> None:
    keys = [(s.task_id, s.traj) for s in samples]
    assert len(keys) == len(set(keys)), "a trajectory counted twice"
    assert set(keys) == {(t.task_id, j) for t in tasks for j in range(TRAJ)}, "a trajectory lost"
    assert len({s.uid for s in samples}) == len(samples)


def test_sampler_killed_while_the_pool_starts_is_started_again(pool):
    """The fixture killed one worker inside its constructor: the pool started it again."""
    assert len(pool.info) == 2 and pool.killed_at_start not in {i["pid"] for i in pool.info}


async def test_sampler_killed_while_loading_a_push_is_replaced_and_loads_it(pool, weights, tmp_path):
    marker = tmp_path / "held"
    pids = {p["pid"] for p in await pool.ping()}
    push = asyncio.ensure_future(pool.receive_weights(HeldWeights(weights, str(marker)), 1))
    killed = await _kill_when_held(marker)
    reports = await asyncio.wait_for(push, 300)
    assert killed in pids and pool.restarts == 1
    # every worker, the replacement included, holds version 1 and its checksums match
    assert [r["version"] for r in reports] == [1, 1]
    assert all(r["checked"] > 0 and not r["problems"] for r in reports), reports
    after = await pool.ping()
    assert killed not in {p["pid"] for p in after} and [p["version"] for p in after] == [1, 1]
    tasks = await pool.tasks("train")
    _assert_whole([s async for s in pool.generate(0, tasks, 1)], tasks)


async def test_sampler_killed_while_scoring_is_replaced_at_the_current_weights(pool):
    tasks = await pool.tasks("train")
    (pool.hold_dir / "armed").touch()
    try:
        gen = asyncio.ensure_future(_collect(pool.generate(1, tasks, 1)))
        await _kill_when_held(pool.hold_dir / "held")
        samples = await asyncio.wait_for(gen, 300)
    finally:
        (pool.hold_dir / "armed").unlink()
    assert pool.restarts == 2
    _assert_whole(samples, tasks)
    assert any("replaced" in f for f in pool.last_stats.failures)
    assert [p["version"] for p in await pool.ping()] == [1, 1]  # the replay reached it


async def test_sampler_killed_between_steps_is_replaced_at_the_next_step(pool):
    tasks = await pool.tasks("train")
    os.kill((await pool.ping())[1]["pid"], signal.SIGKILL)  # idle: no call is under way
    samples = await asyncio.wait_for(_collect(pool.generate(2, tasks, 1)), 300)
    _assert_whole(samples, tasks)
    assert pool.restarts == 3
    assert [p["version"] for p in await pool.ping()] == [1, 1]


async def _collect(stream):
    return [s async for s in stream]


# ---- the same on a GPU, by cuda_ipc -----------------------------------------------------------
def _ipc_trainer(q_in, q_out):
    """A one-rank FSDP2 trainer on the GPU: ("send", v) -> a cuda_ipc payload; ("step",) -> an
    in-place change of every parameter (as the optimiser makes)."""
    from pipeline.conf_files import load_group
    from pipeline.trainer import TrainerConfig, TrainerWorker
    from pipeline.trainer.worker import free_port

    worker = TrainerWorker(0, 1, load_model_config("tiny", ["tiny.seed=1"]),
                           load_group(TrainerConfig, "trainer", "fsdp2"), None, max_response_length=16,
                           temperature=1.0, total_optim_steps=1, gpu_memory_fraction=0.3)
    worker.init("127.0.0.1", free_port())
    q_out.put("ready")
    while (cmd := q_in.get()) is not None:
        if cmd[0] == "send":
            q_out.put(worker.weight_sender_call("cuda_ipc", "send", cmd[1], True))
        else:
            with torch.no_grad():
                for p in worker.model.parameters():
                    p.to_local().mul_(0.5)
            q_out.put("stepped")
    worker.shutdown()


@pytest.mark.gpu
async def test_sampler_killed_while_loading_a_cuda_ipc_push_is_replaced_and_loads_it(tmp_path):
    """Run alone (``-k cuda_ipc``): it starts a Ray that counts this machine's real GPUs."""
    import dataclasses
    import multiprocessing as mp

    import ray

    from pipeline.weight_push import CudaIpcWeights

    class HeldIpcWeights(CudaIpcWeights):
        def __init__(self, inner, marker):
            super().__init__(**{f.name: getattr(inner, f.name) for f in dataclasses.fields(inner)})
            self.marker = marker

        def tensors(self, state):
            _hold_once(self.marker)
            yield from super().tensors(state)

    if ray.is_initialized():
        pytest.skip("run this test alone (-k cuda_ipc): it needs a Ray of the machine's real GPUs")
    ray.init(num_cpus=4, num_gpus=torch.cuda.device_count(), include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_ipc_trainer, args=(q_in, q_out))
    proc.start()
    pool = None
    try:
        assert q_out.get(timeout=300) == "ready"
        pool = SamplerGroup(load_model_config("tiny"), rollout_cfg(n_trajectories=TRAJ, turns=1),
                            {"_target_": "rewards.toy.ToyEnv", "n_tasks": 4}, n_workers=2, num_cpus=1,
                            num_gpus=0.25)
        q_in.put(("send", 1))
        await pool.receive_weights(q_out.get(timeout=120), 1)  # both workers map the buffers
        q_in.put(("step",))
        assert q_out.get(timeout=120) == "stepped"
        q_in.put(("send", 2))
        marker = tmp_path / "held"
        push = asyncio.ensure_future(pool.receive_weights(HeldIpcWeights(q_out.get(timeout=120),
                                                                         str(marker)), 2))
        await _kill_when_held(marker)
        reports = await asyncio.wait_for(push, 300)
        assert pool.restarts == 1 and [r["version"] for r in reports] == [2, 2]
        assert not any(r["problems"] for r in reports), reports
        tasks = await pool.tasks("train")
        _assert_whole([s async for s in pool.generate(0, tasks, 2)], tasks)
        print(f"cuda_ipc: replaced worker loaded version 2, reports {reports}")
    finally:
        if pool is not None:
            pool.shutdown()
        q_in.put(None)
        proc.join(60)
        ray.shutdown()
