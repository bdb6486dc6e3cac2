"""``object_store``: trainer rank 0 gathers the full HF-named state dict (CPU or GPU, any
placement), puts it in the Ray object store once as buckets of ``weight_bucket_mb``; every
sampler fetches the same objects, bucket by bucket, while its engine copies them in."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

import torch

from pipeline.weight_push.base import Checksums, Transport, WeightPushBase, checksums

NAME = "object_store"


@dataclass
class ObjectStoreWeights:
    transport: ClassVar[str] = NAME
    # the buckets stay in the object store until the next export: a replacement worker fetches them too
    replayable: ClassVar[bool] = True
    version: int
    buckets: list[Any]                   # ObjectRefs, each to a list[(name, tensor)]
    checksums: Checksums | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def tensors(self, state: None) -> Iterator[tuple[str, torch.Tensor]]:
        import ray

        # runs in the receiver's load thread (asyncio.to_thread), never on the actor's event loop;
        # Ray still logs "Using blocking ray.get inside async actor" once per sampler actor, for any
        # thread of an async actor. Fetching here bucket by bucket keeps one bucket in memory at a time
        for bucket in self.buckets:
            # a nested ref arrives unresolved; top-level lists of refs as well
            yield from (ray.get(bucket) if isinstance(bucket, ray.ObjectRef) else bucket)

    def finish(self, state: None) -> None:
        pass


class ObjectStoreSender:
    """In a trainer rank: the last export's refs stay alive here until the next one, so a sampler
    started later (a replacement) can still fetch them."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.refs: list[Any] = []

    def send(self, version: int, verify: bool) -> ObjectStoreWeights | None:
        """All ranks join the gather; rank 0 returns the payload."""
        import ray

        t0 = time.perf_counter()
        sd = self.worker.exported_state_dict()
        if sd is None:
            return None
        buckets = self.worker.buckets(sd)
        t1 = time.perf_counter()
        on_gpu = self.worker.device.type == "cuda"  # the gathered copy is on the host: sum it there
        sums = checksums([pair for b in buckets for pair in b], self.worker.device if on_gpu else None) \
            if verify else None
        t2 = time.perf_counter()
        self.refs = [ray.put(b) for b in buckets]
        return ObjectStoreWeights(version, self.refs, sums, {"gather_s": t1 - t0, "checksum_s": t2 - t1,
                                                             "put_s": time.perf_counter() - t2})


class ObjectStorePush(WeightPushBase):
    transport = NAME

    async def _send(self, version: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        payload = await self._senders("send", version, self.verify)
        return payload.timings, await self.samplers.receive_weights(payload, version)


# the payload carries its object refs: no receiver state
TRANSPORT = Transport(NAME, ObjectStorePush, ObjectStoreSender)
