"""A sampler worker: the Ray async actor that generates a batch's trajectories and scores each turn.

``SamplerWorker(model_cfg, rollout_cfg, env_spec, worker_index=0, gpu_memory_fraction=None)``
holds one engine and one RewardEnv, both built inside the actor. ``env_spec`` is a mapping with
``_target_`` (Hydra ``instantiate``: e.g. ``{"_target_": "rewards.toy.ToyEnv", "delay_s": 0.1}``),
a ``"module:Class"`` / ``"module.Class"`` string, or a picklable callable: of no argument, or of
the worker's index when marked ``per_worker`` (what ``rewards.interface.env_spec`` gives for
the kernel env, so each worker times on its own evaluation GPUs). Actor methods:

* ``generate(step, tasks, version, starts=None)``: a streaming generator: lists of ``Sample``,
  each list every sample scored since the last one went out (a Ray stream pays a round trip per
  item, and an HF batch finishes all its samples at once), then one final
  :class:`~pipeline.rollout.BatchStats`. ``starts`` (``(task_id, traj) -> rollout.Start``)
  continues those trajectories from a given history. Backpressure: the caller holds at most
  ``rollout.stream_buffer`` unread samples, then the worker's trajectories wait.
* ``update_weights(payload, version)``: any payload of :mod:`pipeline.weight_push` (object-store
  buckets, CUDA IPC handles, broadcast layout) or ``(name, tensor)`` pairs / a state dict; in
  place, between batches of the engine. ``receive_weights`` is the same, returning timings and
  the checksum comparison; ``weight_receiver_call(transport, method, *args)`` reaches a
  transport's receiver state (a broadcast's ``join``). Both go to the worker's
  :class:`~pipeline.weight_push.WeightReceiver` (``worker.receiver``).
* ``tasks(split)``, ``stats()``, ``sleep()``, ``wake()``, ``ping()``, ``aclose()``.

The group that deals a batch to several of them, and replaces one that is lost, is
:class:`pipeline.sampler.SamplerGroup`.
"""
from __future__ import annotations

import asyncio
import copy
import gc
import importlib
import os
import time
from collections.abc import Mapping
from typing import Any, AsyncIterator

from pipeline.engines import engine_counters
from pipeline.rollout import BatchStats, Starts, stream_episode_chunks
from pipeline.weight_push import REGISTRY, WeightReceiver
from rewards.interface import RewardEnv, TaskRef


def build_env(spec: Any, worker_index: int = 0) -> RewardEnv:
    """A RewardEnv from a ``_target_`` mapping, an import string, or a factory callable (one
    marked ``per_worker = True`` is given the worker's index: e.g. its own evaluation GPUs)."""
    if isinstance(spec, str):
        module, _, name = spec.partition(":") if ":" in spec else spec.rpartition(".")
        try:
            factory = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"env={spec!r}: expected an importable 'module:Class' ({e})") from e
        return factory()
    if callable(spec):
        return spec(worker_index) if getattr(spec, "per_worker", False) else spec()
    if isinstance(spec, Mapping) or hasattr(spec, "_target_") or _is_dictconfig(spec):
        from hydra.utils import instantiate

        if "_target_" not in spec:
            raise ValueError(f"env config {dict(spec)!r} has no _target_ (e.g. rewards.toy.ToyEnv)")
        return instantiate(spec, _convert_="all")
    raise ValueError(f"env={spec!r}: expected a mapping with _target_, an import string or a callable")


def _is_dictconfig(x: Any) -> bool:
    from omegaconf import DictConfig

    return isinstance(x, DictConfig)


def stream_shape(buffer: int) -> tuple[int, int]:
    """(lists a worker's Ray stream may hold unread, samples per list) for ``stream_buffer``:
    together at most ``buffer`` samples; two lists when that allows, so the worker gathers the
    next while the caller reads one."""
    buffer = max(1, int(buffer))
    depth = min(2, buffer)
    return depth, buffer // depth


def _with_memory_fraction(rollout_cfg: Any, fraction: float | None) -> Any:
    if fraction is None or rollout_cfg.engine.type != "vllm":
        return rollout_cfg
    cfg = copy.deepcopy(rollout_cfg)
    cfg.engine.vllm.gpu_memory_utilization = float(fraction)
    return cfg


class SamplerWorker:
    """One engine + one environment; meant to run as a Ray async actor (``ray.remote(SamplerWorker)``)."""

    def __init__(self, model_cfg: Any, rollout_cfg: Any, env_spec: Any, worker_index: int = 0,
                 gpu_memory_fraction: float | None = None) -> None:
        from pipeline.engines import make_engine
        from pipeline.models.load import load_model_and_tokenizer, load_tokenizer

        self.index = worker_index
        self.cfg = _with_memory_fraction(rollout_cfg, gpu_memory_fraction)
        if self.cfg.engine.type == "vllm" and model_cfg.path != "tiny":
            source, self.tokenizer = str(model_cfg.path), load_tokenizer(model_cfg)  # vLLM loads weights
        else:
            source, self.tokenizer = load_model_and_tokenizer(model_cfg)
        self.engine = make_engine(self.cfg.engine, source, self.tokenizer)
        self.env = build_env(env_spec, worker_index)
        self.receiver = WeightReceiver(REGISTRY)
        self.last_stats = BatchStats()
        self.live: BatchStats | None = None  # the batch being generated, for progress()
        self.batches = 0
        # What exists now (torch, transformers, Ray, the model: ~400k objects) lives as long as the
        # actor; a full collection would walk all of it (~250 ms of a CPU core) while the engine
        # thread launches nothing. Frozen, collections see only what batches allocate.
        gc.collect()
        gc.freeze()

    async def generate(self, step: int, tasks: list[TaskRef], version: int,
                       starts: Starts | None = None) -> AsyncIterator[Any]:
        stats = self.live = BatchStats()
        _, per_item = stream_shape(self.cfg.stream_buffer)
        before = engine_counters(self.engine)
        try:
            async for samples in stream_episode_chunks(self.engine, self.tokenizer, self.env, tasks, step,
                                                       version, self.cfg, stats=stats, starts=starts,
                                                       max_chunk=per_item):
                yield samples
        finally:
            self.live = None  # a batch cut short is not under way either
        after = engine_counters(self.engine)
        stats.engine_steps, stats.engine_busy_s = after[0] - before[0], after[1] - before[1]
        self.last_stats, self.batches = stats, self.batches + 1
        yield stats

    def progress(self) -> dict[str, float]:
        """The batch under way, for the loop's heartbeat: generations returned, samples scored
        (the difference is being evaluated) and the engine's requests in flight."""
        live = self.live
        out = {"generating": float(live is not None)}
        engine = self.engine.stats()
        if "inflight" in engine:  # vLLM's requests not finished; HF does not count them
            out["engine_inflight"] = float(engine["inflight"])
        if live is not None:
            out.update(step=float(live.step), generated=float(live.n_generated), scored=float(live.n_samples),
                       seconds=time.time() - live.t_start if live.t_start else 0.0)
            in_flight = getattr(self.env, "in_flight", None)  # an env of the user's may not say
            out.update({f"eval/{k}": float(v) for k, v in (in_flight() if in_flight else {}).items()})
        return out

    async def receive_weights(self, payload: Any, version: int) -> dict[str, Any]:
        """Load ``payload`` into the engine as ``version``; the report of
        :meth:`~pipeline.weight_push.WeightReceiver.receive` (seconds, checksum comparison)."""
        return await self.receiver.receive(self.engine, payload, version)

    def weight_receiver_call(self, transport: str, method: str, *args: Any) -> Any:
        """The actor entry of every transport: ``method(*args)`` of this process's receiver state."""
        return self.receiver.call(transport, method, *args)

    async def update_weights(self, payload: Any, version: int) -> int:
        # the engine copies under its batch lock: receive_weights runs it off the event loop
        report = await self.receive_weights(payload, version)
        if report.get("problems"):
            raise RuntimeError(f"sampler worker {self.index}: weights version {version} differ from the "
                               "sender's after loading: " + "; ".join(report["problems"][:10]))
        return report["version"]

    def tasks(self, split: str) -> list[TaskRef]:
        return self.env.tasks(split)

    def stats(self) -> dict[str, float]:
        out = {f"engine/{k}": float(v) for k, v in self.engine.stats().items()}
        out.update({f"last_batch/{k}": v for k, v in self.last_stats.metrics().items()})
        out["batches"] = float(self.batches)
        return out

    async def sleep(self) -> None:
        await asyncio.to_thread(self.engine.sleep)

    async def wake(self) -> None:
        await asyncio.to_thread(self.engine.wake)

    def ping(self) -> dict[str, Any]:
        return {"index": self.index, "pid": os.getpid(), "version": self.engine.version,
                "engine": type(self.engine).__name__}

    async def aclose(self) -> None:
        await self.engine.aclose()
        await self.env.aclose()
        gc.unfreeze()  # a worker built in the caller's process hands its objects back to the collector
