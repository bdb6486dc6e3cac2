"""SamplerWorker / SamplerGroup under a real local Ray, tiny model, HF engine on CPU."""
import asyncio
import gc

import pytest

from pipeline.models import build_tiny, load_model_config
from pipeline.rollout import Start
from pipeline.sample import Sample
from rewards.interface import Turn
from pipeline.sampler import SamplerGroup
from pipeline.sampler_worker import SamplerWorker, build_env, stream_shape
from pipeline.weight_push import ObjectStoreWeights
from rewards.toy import ToyEnv

from tests.pipeline.conftest import rollout_cfg

TOY = {"_target_": "rewards.toy.ToyEnv", "n_tasks": 3, "delay_s": 0.05}


@pytest.fixture(scope="module")
def pool(ray_sampling):
    cfg = rollout_cfg(n_trajectories=3, turns=3, temperature=0.0, stream_buffer=1)
    p = SamplerGroup(load_model_config("tiny"), cfg, TOY, n_workers=2, num_cpus=1)
    yield p
    p.shutdown()


def test_build_env_from_specs():
    assert isinstance(build_env(TOY), ToyEnv) and build_env(TOY).delay_s == 0.05
    assert isinstance(build_env("rewards.toy:ToyEnv"), ToyEnv)
    with pytest.raises(ValueError, match="no _target_"):
        build_env({"delay_s": 1})
    with pytest.raises(ValueError, match="rewards.nope:Env"):
        build_env("rewards.nope:Env")


async def test_worker_hands_over_an_engine_batch_in_one_item():
    """Every sample of one HF batch travels in one stream item (one Ray round trip, not 12), and
    the objects that live as long as the worker are out of the collector's way until aclose."""
    cfg = rollout_cfg(n_trajectories=4, turns=1)
    worker = SamplerWorker(load_model_config("tiny"), cfg, {**TOY, "delay_s": 0.0})
    try:
        assert gc.get_freeze_count() > 100_000  # torch, transformers, the model ...
        items = [x async for x in worker.generate(2, worker.tasks("train"), 0)]
    finally:
        await worker.aclose()
    assert gc.get_freeze_count() == 0
    chunks, stats = items[:-1], items[-1]
    assert worker.engine.stats()["batches"] == 1 and [len(c) for c in chunks] == [3 * 4]
    assert all(isinstance(s, Sample) and s.step == 2 for s in chunks[0]) and stats.n_samples == 12
    assert stats.n_generated == 12 and worker.progress() == {"generating": 0.0}  # HF: no in-flight count


def test_stream_shape_keeps_unread_samples_within_the_buffer():
    assert stream_shape(1) == (1, 1) and stream_shape(3) == (2, 1) and stream_shape(256) == (2, 128)
    assert all(depth * per_item <= b for b in range(1, 300) for depth, per_item in [stream_shape(b)])


async def test_pool_streams_samples_from_every_worker(pool):
    tasks = await pool.tasks("train")
    assert [len(p) for p in pool.split(tasks)] == [2, 1]
    samples = []
    async for s in pool.generate(7, tasks, 0):
        assert isinstance(s, Sample)
        samples.append(s)
    assert len(samples) == 3 * 3 * 3 and {s.task_id for s in samples} == {t.task_id for t in tasks}
    assert all(s.step == 7 and s.error is None for s in samples)
    assert pool.last_stats.n_samples == 27 and pool.last_stats.n_tasks == 3
    stats = await pool.stats()
    assert [s["batches"] for s in stats] == [1.0, 1.0] and all(s["engine/requests"] > 0 for s in stats)
    # the batch's engine counters: both workers' generate calls (HF) and the seconds inside them
    assert pool.last_stats.engine_steps == sum(s["engine/batches"] for s in stats) >= 2
    m = pool.last_stats.metrics()
    assert m["perf/engine_steps"] >= 2 and 0 < m["perf/engine_step_ms"] <= 1e3 * pool.last_stats.gen_s
    info = await pool.ping()
    assert len({i["pid"] for i in info}) == 2


async def test_progress_counts_the_batch_under_way(pool):
    """What the loop's heartbeat reads mid-batch: per worker, generations returned and samples
    scored so far of the batch being generated; nothing once it is done."""
    tasks = await pool.tasks("train")
    seen = []
    async for s in pool.generate(9, tasks, 0):
        if not seen:
            seen = await pool.progress()
    busy = [w for w in seen if w["generating"]]
    assert busy, seen  # the first sample arrived while the rest of the batch was under way
    assert all(w["step"] == 9 and 0 <= w["scored"] <= w["generated"] <= 27 and w["seconds"] > 0 for w in busy)
    assert [w["generating"] for w in await pool.progress()] == [0.0, 0.0]
    assert pool.last_stats.n_generated == pool.last_stats.n_samples == 27


async def test_starts_reach_the_worker_holding_their_task(pool):
    tasks = await pool.tasks("train")
    history = [Turn("", "ab", "Your previous answer scored 0.500 (share of 'a').")]
    starts = {(t.task_id, 2): Start(history, first_turn=3, round=1, parent=0) for t in tasks}
    samples = [s async for s in pool.generate(0, tasks, 0, starts)]
    assert len(samples) == 27 and len({s.uid for s in samples}) == 27
    for t in tasks:  # tasks 0 and 2 on worker 0, task 1 on worker 1
        cont = sorted(s.turn for s in samples if (s.task_id, s.traj) == (t.task_id, 2))
        assert cont == [3, 4, 5]
        assert all(s.round == 1 and s.parent == 0 for s in samples
                   if (s.task_id, s.traj) == (t.task_id, 2))
        assert sorted(s.turn for s in samples if (s.task_id, s.traj) == (t.task_id, 0)) == [0, 1, 2]


async def test_update_weights_changes_outputs_on_every_worker(pool):
    tasks = (await pool.tasks("train"))[:2]  # one task per worker

    async def outputs():
        return {s.uid.split("/", 1)[1]: (s.response_ids, s.policy_version)
                async for s in pool.generate(0, tasks, 0)}

    before = await outputs()
    original, _ = build_tiny(load_model_config("tiny").tiny)
    other, _ = build_tiny(load_model_config("tiny", ["tiny.seed=3"]).tiny)
    import ray

    # the object-store payload weight_push sends: buckets of (name, tensor) lists in the store
    names = list(other.state_dict().items())
    payload = ObjectStoreWeights(1, [ray.put(names[:10]), ray.put(names[10:])])
    assert await pool.update_weights(payload, 1) == [1, 1]
    after = await outputs()
    assert {v for _, v in after.values()} == {1}
    assert all(after[k][0] != before[k][0] for k in before)  # greedy: different weights, other tokens
    await pool.update_weights(ray.put(dict(original.state_dict())), 2)  # a state dict by reference
    restored = await outputs()
    assert all(restored[k][0] == before[k][0] for k in before)


async def test_sleep_then_wake(pool):
    tasks = (await pool.tasks("train"))[:1]
    await pool.sleep()
    asleep = [s async for s in pool.generate(0, tasks, 0)]
    assert asleep and all(s.error and "EngineAsleep" in s.error for s in asleep)
    await pool.wake()
    awake = [s async for s in pool.generate(0, tasks, 0)]
    assert len(awake) == 9 and all(s.error is None for s in awake)


async def test_slow_consumer_applies_backpressure(pool):
    """stream_buffer=1: a consumer that does not read keeps the workers from running ahead."""
    tasks = await pool.tasks("train")
    stream = pool.generate(1, tasks, 0)
    first = await stream.__anext__()
    await asyncio.sleep(3.0)  # ample time to finish all 27 samples if nothing held them back
    stats = await pool.stats()
    done_so_far = sum(s["engine/requests"] for s in stats)
    rest = [s async for s in stream]
    assert 1 + len(rest) == 27 and first.step == 1
    total = sum(s["engine/requests"] for s in await pool.stats())
    assert done_so_far < total  # some generations only started once the consumer read on
