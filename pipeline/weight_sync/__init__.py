"""Trainer -> sampler weight transfer, versioned: one object per transport, one file each.

* ``object_store`` (:mod:`.object_store`): CPU, or anything; Ray object store buckets.
* ``cuda_ipc`` (:mod:`.cuda_ipc`): sampler and trainer on one GPU; persistent buffers mapped once.
* ``broadcast`` (:mod:`.broadcast`): separate GPUs or nodes; a process group of its own.

With ``trainer.lora`` every transport sends merged weights under the base names
(:func:`pipeline.trainer.lora.merged`). :mod:`.base` holds the contract (sender in the trainer rank, payload across Ray, push in the
driver) and what the transports share; :mod:`.receiver` the sampler side.
"""
from __future__ import annotations

from typing import Any

from pipeline.weight_sync.base import (Checksums, FlatLayout, Payload, WeightPushBase, checksums,
                                       compare_checksums, flat_layouts, gathered_without_aliases,
                                       pack, without_aliases)
from pipeline.weight_sync.broadcast import BroadcastPush, BroadcastSender, BroadcastWeights
from pipeline.weight_sync.cuda_ipc import CudaIpcPush, CudaIpcSender, CudaIpcWeights
from pipeline.weight_sync.object_store import ObjectStorePush, ObjectStoreSender, ObjectStoreWeights
from pipeline.weight_sync.receiver import WeightReceiver, WeightReceiverMixin

TRANSPORTS = ("auto", "object_store", "cuda_ipc", "broadcast")
PUSHES: dict[str, type[WeightPushBase]] = {c.transport: c for c in (ObjectStorePush, CudaIpcPush, BroadcastPush)}
SENDERS = {c.transport: c for c in (ObjectStoreSender, CudaIpcSender, BroadcastSender)}

__all__ = ["TRANSPORTS", "BroadcastWeights", "Checksums", "CudaIpcWeights", "FlatLayout",
           "ObjectStoreWeights", "Payload", "WeightReceiver", "WeightReceiverMixin", "checksums",
           "choose_transport", "compare_checksums", "flat_layouts", "gathered_without_aliases",
           "make_weight_sync", "pack", "without_aliases"]


def choose_transport(name: str, colocated: bool, on_gpu: bool, shared_gpus: int = 1) -> str:
    """``auto``: object store on CPU; CUDA IPC when the pools share one GPU; a broadcast group
    across separate GPUs. Pools sharing several GPUs use the object store: IPC reaches only the
    samplers on trainer rank 0's GPU, and NCCL refuses two ranks on one device."""
    if name not in TRANSPORTS:
        raise ValueError(f"pipeline.weight_sync={name!r}: expected one of {TRANSPORTS}")
    if name != "auto":
        return name
    if not on_gpu:
        return "object_store"
    if colocated:
        return "cuda_ipc" if shared_gpus == 1 else "object_store"
    return "broadcast"


def make_weight_sync(trainer: Any, samplers: Any, transport: str, timeout_s: float,
                     verify: bool = True) -> WeightPushBase:
    """The push object of ``transport`` (a name ``choose_transport`` returned); ``timeout_s``
    bounds forming a broadcast group (``pipeline.weight_sync_timeout_s``)."""
    if transport not in PUSHES:
        raise ValueError(f"pipeline.weight_sync={transport!r}: expected one of {tuple(PUSHES)} "
                         "(resolve 'auto' with choose_transport first)")
    return PUSHES[transport](trainer, samplers, timeout_s=timeout_s, verify=verify)
