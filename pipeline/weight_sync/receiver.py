"""The sampler side of every transport: a :class:`WeightReceiver` per sampler process turns any
payload into ``(HF name, tensor)`` pairs for ``Engine.load_weights``; a sampler actor mixes in
:class:`WeightReceiverMixin` for the actor methods a push calls."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator

import torch

from pipeline.weight_sync.base import Payload, new_group


class WeightReceiver:
    """Lives in a sampler process; holds what outlives one push (the broadcast group, the CUDA IPC
    mapping of the trainer's buffers)."""

    def __init__(self) -> None:
        self.group: Any = None
        self.rank = -1
        self.mapped: Any = None  # cuda_ipc.Mapped

    def join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        self.group, self.rank = new_group(host, port, rank, world_size, timeout_s), rank

    def ipc_mapped(self, payload: Any) -> Any:
        """The trainer's buffers, mapped at the first push and kept: a new buffer id (the trainer
        allocated again) drops the old mapping first."""
        from pipeline.weight_sync.cuda_ipc import open_mapping

        if self.mapped is None or self.mapped.buffer_id != payload.buffer_id:
            self.mapped = None
            self.mapped = open_mapping(payload)
        return self.mapped

    def named_tensors(self, payload: Any) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(payload, Payload):
            yield from payload.tensors(self)
        elif isinstance(payload, dict):
            yield from payload.items()
        else:
            yield from payload  # already (name, tensor) pairs

    def finish(self, payload: Any) -> None:
        if isinstance(payload, Payload):
            payload.finish(self)


class _Timed:
    """An iterator that adds up the time spent producing its items (the transport's share of a
    load that interleaves receiving and copying)."""

    def __init__(self, items: Iterator[Any]) -> None:
        self.items, self.seconds, self.count = items, 0.0, 0

    def __iter__(self) -> "_Timed":
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        try:
            item = next(self.items)
        finally:
            self.seconds += time.perf_counter() - t0
        self.count += 1
        return item


class WeightReceiverMixin:
    """For a sampler Ray actor with an ``engine``: ``join_weight_group`` and ``receive_weights``
    as actor methods."""

    def join_weight_group(self, host: str, port: int, rank: int, world_size: int,
                          timeout_s: float) -> None:
        self._weight_receiver().join(host, port, rank, world_size, timeout_s)

    async def receive_weights(self, payload: Any, version: int) -> dict[str, Any]:
        """Load ``payload`` into the engine (off the event loop, so streams keep flowing); with the
        payload's checksums, compare the engine's tensors with them. Returns seconds and counts:
        ``receive_s`` (producing the tensors), ``load_s`` (the engine's copies, until the device
        has finished them), ``check_s``, ``checked`` and ``problems``."""
        receiver = self._weight_receiver()
        timed = _Timed(receiver.named_tensors(payload))
        t0 = time.perf_counter()

        def load() -> None:
            self.engine.load_weights(timed, version)
            receiver.finish(payload)

        await asyncio.to_thread(load)
        total = time.perf_counter() - t0
        report: dict[str, Any] = {"version": self.engine.version, "tensors": timed.count,
                                  "receive_s": timed.seconds, "load_s": total - timed.seconds}
        sums = getattr(payload, "checksums", None)
        if sums:
            t1 = time.perf_counter()
            report.update(await asyncio.to_thread(self.engine.check_weights, sums))
            report["check_s"] = time.perf_counter() - t1
        return report

    def _weight_receiver(self) -> WeightReceiver:
        if getattr(self, "_receiver", None) is None:
            self._receiver = WeightReceiver()
        return self._receiver
