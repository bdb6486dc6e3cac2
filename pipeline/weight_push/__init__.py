"""Trainer -> sampler weight transfer, versioned: one transport per file, registered here.

* ``object_store`` (:mod:`.object_store`): CPU, or anything; Ray object store buckets.
* ``cuda_ipc`` (:mod:`.cuda_ipc`): sampler and trainer on one GPU; persistent buffers mapped once.
* ``broadcast`` (:mod:`.broadcast`): separate GPUs or nodes; a process group of its own.

With ``trainer.lora`` every transport sends merged weights under the base names
(:func:`pipeline.trainer.lora.merged`). :mod:`.base` holds the contract (a sender in each trainer
rank, a payload across Ray, a receiver state in each sampler process, a push in the driver) and
what the transports share; :mod:`.receiver` the sampler process's side of every transport.

Adding a transport ``foo``:

1. Write ``pipeline/weight_push/foo.py`` with ``NAME = "foo"`` and its four parts: a payload
   dataclass (``transport = NAME``, ``replayable``, ``version``, ``checksums``, ``timings``,
   ``tensors(state)``, ``finish(state)``: :class:`~.base.Payload`); a sender class made as
   ``Sender(worker)`` once per trainer rank (its state: buffers, a group); a receiver state class
   made as ``Receiver()`` once per sampler process, if the transport keeps one; a push, a
   :class:`~.base.WeightPushBase` subclass (``transport = NAME``) whose ``_send`` calls the
   senders with ``self._senders(method, *args)`` and the receiver states with each sampler
   worker's ``weight_receiver_call.remote(NAME, method, *args)``, and hands the payload to
   ``self.samplers.receive_weights``. End it with ``TRANSPORT = Transport(NAME, Push, Sender,
   Receiver)``.
2. Add ``foo.TRANSPORT`` to :data:`REGISTRY` below, and a rule to :func:`choose_transport` if
   ``auto`` is to pick it.
3. Name it in the comment of ``pipeline.weight_push`` in pipeline/loop_config.py and
   conf/pipeline/default.yaml, and its settings, if any, as ``pipeline.weight_push_*`` keys there,
   passed to the push by :func:`make_weight_push`.

Nothing in the trainer or the sampler worker changes: they reach a sender or a receiver state only
through the registry (``weight_sender_call`` / ``weight_receiver_call``).
"""
from __future__ import annotations

from typing import Any

from pipeline.weight_push import broadcast, cuda_ipc, object_store
from pipeline.weight_push.base import (Checksums, FlatLayout, Payload, Transport, WeightPushBase, checksums,
                                       compare_checksums, flat_layouts, gathered_without_aliases,
                                       pack, replayable, without_aliases)
from pipeline.weight_push.broadcast import BroadcastWeights
from pipeline.weight_push.cuda_ipc import CudaIpcWeights
from pipeline.weight_push.object_store import ObjectStoreWeights
from pipeline.weight_push.receiver import WeightReceiver

REGISTRY: dict[str, Transport] = {t.name: t for t in (object_store.TRANSPORT, cuda_ipc.TRANSPORT,
                                                      broadcast.TRANSPORT)}
TRANSPORTS = ("auto", *REGISTRY)

__all__ = ["REGISTRY", "TRANSPORTS", "BroadcastWeights", "Checksums", "CudaIpcWeights", "FlatLayout",
           "ObjectStoreWeights", "Payload", "Transport", "WeightReceiver", "checksums",
           "choose_transport", "compare_checksums", "flat_layouts", "gathered_without_aliases",
           "make_weight_push", "pack", "replayable", "without_aliases"]


def choose_transport(name: str, colocated: bool, on_gpu: bool, shared_gpus: int = 1) -> str:
    """``auto``: object store on CPU; CUDA IPC when the pools share one GPU; a broadcast group
    across separate GPUs. Pools sharing several GPUs use the object store: IPC reaches only the
    samplers on trainer rank 0's GPU, and NCCL refuses two ranks on one device."""
    if name not in TRANSPORTS:
        raise ValueError(f"pipeline.weight_push={name!r}: expected one of {TRANSPORTS}")
    if name != "auto":
        return name
    if not on_gpu:
        return "object_store"
    if colocated:
        return "cuda_ipc" if shared_gpus == 1 else "object_store"
    return "broadcast"


def make_weight_push(trainer: Any, samplers: Any, transport: str, timeout_s: float,
                     verify: bool = True) -> WeightPushBase:
    """The push object of ``transport`` (a name ``choose_transport`` returned); ``timeout_s``
    bounds forming a broadcast group (``pipeline.weight_push_timeout_s``)."""
    if transport not in REGISTRY:
        raise ValueError(f"pipeline.weight_push={transport!r}: expected one of {tuple(REGISTRY)} "
                         "(resolve 'auto' with choose_transport first)")
    return REGISTRY[transport].push(trainer, samplers, timeout_s=timeout_s, verify=verify)

