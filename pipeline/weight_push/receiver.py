"""The sampler side of every transport: a :class:`WeightReceiver` per sampler process (the
sampler worker holds one) turns any payload into ``(HF name, tensor)`` pairs for
``Engine.load_weights`` and keeps each transport's receiver state across pushes."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator, Mapping

import torch

from pipeline.weight_push.base import Payload, Transport


class WeightReceiver:
    """Lives in a sampler process. ``transports``: the registry
    (:data:`pipeline.weight_push.REGISTRY`) whose receiver states it makes, each at first use."""

    def __init__(self, transports: Mapping[str, Transport]) -> None:
        self.transports = transports
        self.states: dict[str, Any] = {}

    def state(self, transport: str) -> Any:
        """This process's receiver state of ``transport`` (None for a transport without one)."""
        if transport not in self.states:
            if transport not in self.transports:
                raise ValueError(f"weight transport {transport!r}: expected one of {tuple(self.transports)}")
            make = self.transports[transport].receiver
            self.states[transport] = make() if make is not None else None
        return self.states[transport]

    def call(self, transport: str, method: str, *args: Any) -> Any:
        """``method(*args)`` of the receiver state of ``transport`` (e.g. a broadcast's ``join``)."""
        return getattr(self.state(transport), method)(*args)

    def named_tensors(self, payload: Any) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(payload, Payload):
            yield from payload.tensors(self.state(payload.transport))
        elif isinstance(payload, dict):
            yield from payload.items()
        else:
            yield from payload  # already (name, tensor) pairs

    def finish(self, payload: Any) -> None:
        if isinstance(payload, Payload):
            payload.finish(self.state(payload.transport))

    async def receive(self, engine: Any, payload: Any, version: int) -> dict[str, Any]:
        """Load ``payload`` into ``engine`` (off the event loop, so streams keep flowing); with the
        payload's checksums, compare the engine's tensors with them. Returns seconds and counts:
        ``receive_s`` (producing the tensors), ``load_s`` (the engine's copies, until the device
        has finished them), ``check_s``, ``checked`` and ``problems``."""
        timed = _Timed(self.named_tensors(payload))
        t0 = time.perf_counter()

        def load() -> None:
            engine.load_weights(timed, version)
            self.finish(payload)

        await asyncio.to_thread(load)
        total = time.perf_counter() - t0
        report: dict[str, Any] = {"version": engine.version, "tensors": timed.count,
                                  "receive_s": timed.seconds, "load_s": total - timed.seconds}
        sums = payload.checksums if isinstance(payload, Payload) else None
        if sums:
            t1 = time.perf_counter()
            report.update(await asyncio.to_thread(engine.check_weights, sums))
            report["check_s"] = time.perf_counter() - t1
        return report


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
