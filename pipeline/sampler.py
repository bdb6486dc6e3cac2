"""The group of sampler workers (Ray async actors) that splits a batch across them.

The workers are :class:`pipeline.sampler_worker.SamplerWorker` (one engine and one RewardEnv
each, built inside the actor; its module says what ``env_spec`` may be and lists its methods).

``SamplerGroup(model_cfg, rollout_cfg, env_spec, resource_pool=None, n_workers=1, ...)`` spawns one
worker per bundle of ``resource_pool`` (a :class:`pipeline.resources.ResourcePool`, i.e.
anything with ``len`` and ``actor_options(i)``) or ``n_workers`` plain actors; ``actor_options``
(one dict, or one per worker) adds or overrides Ray options such as ``scheduling_strategy``. Then::

    async for sample in samplers.generate(step, tasks, version): ...   # merged streams
    async for sample in samplers.generate(step, tasks, version, starts): ...  # continuing trajectories
    samplers.last_stats                                                # BatchStats of that batch
    await samplers.update_weights(payload, version)                    # every worker
    await samplers.sleep(); await samplers.wake(); await samplers.stats()
    samplers.workers; samplers.shutdown()

Tasks are dealt whole (all trajectories of a task on one worker, so prefix caching sees them),
round-robin in the given order.
"""
from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any, AsyncIterator

from pipeline.parts import LOSSES_PER_CALL, PushInterrupted, WeightsGone
from pipeline.rollout import BatchStats, Starts
from pipeline.sample import Sample
from pipeline.sampler_worker import SamplerWorker, stream_shape
from pipeline.weight_push import replayable
from rewards.interface import TaskRef

if TYPE_CHECKING:
    from pipeline.models.config import ModelConfig
    from pipeline.rollout_config import RolloutConfig


def _weights_lost(e: BaseException) -> bool:
    from ray.exceptions import ObjectLostError

    return isinstance(e, ObjectLostError) or isinstance(getattr(e, "cause", None), ObjectLostError)


def _actor_lost(e: BaseException) -> bool:
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return isinstance(e, (ActorDiedError, ActorUnavailableError, RayActorError))


class SamplerGroup:
    """k sampler workers behind one ``generate`` stream (see the module docstring)."""

    def __init__(self, model_cfg: ModelConfig, rollout_cfg: RolloutConfig, env_spec: Any,
                 resource_pool: Any = None, n_workers: int = 1, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 gpu_memory_fraction: float | None = None, env_vars: dict[str, str] | None = None,
                 actor_options: dict[str, Any] | list[dict[str, Any]] | None = None) -> None:
        import ray

        n = len(resource_pool) if resource_pool is not None else n_workers
        if n < 1:
            raise ValueError(f"SamplerGroup needs at least one worker (got {n})")
        extra = actor_options if isinstance(actor_options, list) else [actor_options or {}] * n
        if len(extra) != n:
            raise ValueError(f"actor_options has {len(extra)} entries for {n} sampler workers")
        actor_cls = ray.remote(SamplerWorker)
        self.cfg = rollout_cfg
        self.workers: list[Any] = []
        self._spawn_args: list[tuple[dict[str, Any], tuple]] = []
        for i in range(n):
            opts = resource_pool.actor_options(i) if resource_pool is not None else {"num_cpus": num_cpus,
                                                                    "num_gpus": num_gpus}
            if env_vars:
                opts["runtime_env"] = {"env_vars": dict(env_vars)}
            opts.update(extra[i])
            self._spawn_args.append((opts, (model_cfg, rollout_cfg, env_spec, i, gpu_memory_fraction)))
            self.workers.append(actor_cls.options(**opts).remote(*self._spawn_args[i][1]))
        self._actor_cls = actor_cls
        self.info = [self._started(i) for i in range(n)]  # surfaces build errors now
        self.last_stats = BatchStats()
        self.restarts = 0
        self._last_weights: tuple[Any, int] | None = None  # replayable to a replacement worker
        self._last_weights_version = 0
        self._replacing: dict[int, asyncio.Lock] = {}

    def _started(self, i: int) -> dict[str, Any]:
        """Worker ``i``'s ping once it is up; one lost while it starts is started again."""
        import ray

        for attempt in range(LOSSES_PER_CALL + 1):
            try:
                return ray.get(self.workers[i].ping.remote())
            except Exception as e:
                if attempt == LOSSES_PER_CALL or not _actor_lost(e):
                    raise
                print(f"[sampler] worker {i} was lost while starting ({type(e).__name__}); starting "
                      "it again", file=sys.stderr, flush=True)
                opts, args = self._spawn_args[i]
                self.workers[i] = self._actor_cls.options(**opts).remote(*args)
        raise AssertionError("unreachable")

    def split(self, tasks: list[TaskRef]) -> list[list[TaskRef]]:
        parts: list[list[TaskRef]] = [[] for _ in self.workers]
        for i, task in enumerate(tasks):
            parts[i % len(parts)].append(task)
        return parts

    async def generate(self, step: int, tasks: list[TaskRef], version: int,
                       starts: Starts | None = None) -> AsyncIterator[Sample]:
        queue: asyncio.Queue = asyncio.Queue(maxsize=max(1, int(self.cfg.stream_buffer)))
        backpressure = {"_generator_backpressure_num_objects": stream_shape(self.cfg.stream_buffer)[0]}
        stats: list[BatchStats] = []
        done = object()

        async def drain(i: int, worker: Any, part: list[TaskRef]) -> None:
            ids = {t.task_id for t in part}
            part_starts = {k: v for k, v in (starts or {}).items() if k[0] in ids} or None
            # trajectories with a sample already handed on: after a restart their regenerated
            # samples are dropped (a trajectory never mixes two runs; no uid is delivered twice)
            delivered: set[tuple[str, int]] = set()
            try:
                for attempt in range(LOSSES_PER_CALL + 1):
                    keep_out = set(delivered)
                    try:
                        stream = worker.generate.options(**backpressure).remote(step, part, version,
                                                                                part_starts)
                        discarded = 0
                        async for ref in stream:
                            item = await ref
                            if isinstance(item, BatchStats):
                                if attempt:
                                    item.n_samples -= discarded  # count only what was delivered
                                    item.failures = (item.failures + [
                                        f"sampler worker {i} was lost during step {step} and replaced: "
                                        f"{len(part)} task(s) generated again, {discarded} regenerated "
                                        f"sample(s) of {len(keep_out)} partly delivered trajectories "
                                        "dropped"])[:20]
                                stats.append(item)
                                continue
                            for sample in item:
                                if (sample.task_id, sample.traj) in keep_out:
                                    discarded += 1
                                else:
                                    delivered.add((sample.task_id, sample.traj))
                                    await queue.put(sample)
                        return
                    except Exception as e:
                        if attempt == LOSSES_PER_CALL or not _actor_lost(e):
                            raise
                        print(f"[sampler] worker {i} lost during step {step} ({type(e).__name__}); "
                              "starting a replacement", file=sys.stderr, flush=True)
                        worker = await self._replace(i, worker)
            except WeightsGone as e:
                await queue.put(e)
            except Exception as e:
                await queue.put(RuntimeError(f"sampler worker {i} failed during step {step}: "
                                             f"{type(e).__name__}: {e}"))
            finally:
                await queue.put(done)

        parts = [(i, w, p) for i, (w, p) in enumerate(zip(self.workers, self.split(tasks))) if p]
        drains = [asyncio.get_running_loop().create_task(drain(*x)) for x in parts]
        try:
            open_streams = len(drains)
            while open_streams:
                item = await queue.get()
                if item is done:
                    open_streams -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for d in drains:
                d.cancel()
        merged = BatchStats()
        for s in stats:
            merged = merged.merge(s)
        self.last_stats = merged

    async def _all(self, method: str, *args: Any) -> list[Any]:
        return list(await asyncio.gather(*[getattr(w, method).remote(*args) for w in self.workers]))

    async def update_weights(self, payload: Any, version: int) -> list[int]:
        return [r["version"] for r in await self.receive_weights(payload, version)]

    async def receive_weights(self, payload: Any, version: int) -> list[dict[str, Any]]:
        """Every worker loads ``payload``; one report each (``WeightReceiver.receive``).
        A worker lost while it loads a replayable payload is replaced and handed it again; one lost
        inside a payload that is not replayable is replaced, and once every other worker's load has
        ended (the broken collective fails theirs too), :class:`PushInterrupted` says so."""
        can_replay = replayable(payload)
        self._last_weights = (payload, version) if can_replay else None
        self._last_weights_version = version
        before = self.restarts
        results = await asyncio.gather(*[self._receive_on(i, w, payload, version)
                                         for i, w in enumerate(self.workers)], return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors and not can_replay and self.restarts != before:
            raise PushInterrupted(f"{self.restarts - before} sampler worker(s) lost inside the push of "
                                  f"version {version} and replaced; the push must be made again "
                                  f"(first error: {type(errors[0]).__name__}: {errors[0]})")
        if errors:
            raise errors[0]
        return list(results)

    async def _receive_on(self, i: int, worker: Any, payload: Any, version: int) -> dict[str, Any]:
        can_replay = replayable(payload)
        for attempt in range(LOSSES_PER_CALL + 1):
            try:
                return await worker.receive_weights.remote(payload, version)
            except Exception as e:
                if attempt == LOSSES_PER_CALL or not _actor_lost(e):
                    raise
                print(f"[sampler] worker {i} lost while loading weights version {version} "
                      f"({type(e).__name__}); starting a replacement", file=sys.stderr, flush=True)
                worker = await self._replace(i, worker, replay=False)
                if not can_replay:  # the payload cannot reach it: the caller pushes again
                    raise
        raise AssertionError("unreachable")

    async def _replace(self, i: int, dead: Any, replay: bool = True) -> Any:
        """A new actor in worker ``i``'s place (same bundle), with the newest weights when they can
        be replayed; otherwise its samples carry the older ``policy_version`` they were made with.
        Once per lost actor: a push and a batch that both saw it die share one replacement. A
        replacement lost while it starts is replaced in turn (``LOSSES_PER_CALL`` times)."""
        import ray

        async with self._replacing.setdefault(i, asyncio.Lock()):
            if self.workers[i] is not dead:
                return self.workers[i]
            for attempt in range(LOSSES_PER_CALL + 1):
                try:
                    ray.kill(dead)
                except Exception:
                    pass
                opts, args = self._spawn_args[i]
                worker = self._actor_cls.options(**opts).remote(*args)
                try:
                    await worker.ping.remote()
                    if replay and self._last_weights is not None:
                        await worker.update_weights.remote(*self._last_weights)
                except Exception as e:
                    if _weights_lost(e):  # a trainer restart took the payload's owner with it
                        self.workers[i], self._last_weights = worker, None
                        self.restarts += 1
                        raise WeightsGone(f"sampler worker {i} was replaced, but weights version "
                                          f"{self._last_weights_version} are gone with the trainer "
                                          f"rank that held them ({type(e).__name__})") from e
                    if attempt == LOSSES_PER_CALL or not _actor_lost(e):
                        raise
                    print(f"[sampler] the replacement of worker {i} was lost while starting "
                          f"({type(e).__name__}); starting another", file=sys.stderr, flush=True)
                    dead = worker
                    continue
                self.workers[i] = worker
                self.restarts += 1
                return worker
        raise AssertionError("unreachable")

    async def stats(self) -> list[dict[str, float]]:
        return await self._all("stats")

    async def progress(self) -> list[dict[str, float]]:
        return await self._all("progress")

    async def sleep(self) -> None:
        await self._all("sleep")

    async def wake(self) -> None:
        await self._all("wake")

    async def ping(self) -> list[dict[str, Any]]:
        return await self._all("ping")

    async def tasks(self, split: str) -> list[TaskRef]:
        return await self.workers[0].tasks.remote(split)

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.get(w.aclose.remote(), timeout=30)
            except Exception:
                pass  # a dead worker has nothing left to close
            ray.kill(w)
        self.workers = []
