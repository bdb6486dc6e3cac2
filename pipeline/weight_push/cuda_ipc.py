"""``cuda_ipc`` (sampler and trainer on one GPU): persistent flat buffers mapped once.

Trainer rank 0 owns one flat GPU buffer per dtype holding the whole exported model (a tied
weight once) and a one-element version header. At the first push it exports their CUDA IPC
handles (``torch.multiprocessing.reductions.reduce_tensor``) and each sampler maps them
(``cudaIpcOpenMemHandle``) and keeps the mapping. Every push is then a device-to-device copy of
the weights into the buffers, the version written into the header behind them on the same
stream, a stream synchronisation, and a small Ray message; the sampler checks the header holds
the version it was told before its engine copies views of the buffers. No mapping, no
allocation, no host round trip per push.

Why the reader never sees a half-written buffer: the trainer returns the payload only after its
stream has finished the copies and the header; the sampler synchronises its device after its
engine has copied everything, before its report returns; the driver starts the next push only
after every report is back. The header catches a payload handed to a sampler out of that order.

The price: the GPU the pools share holds a second copy of the model in the export dtype
(0.99 GB for a 0.5B model in bf16) for the whole run.
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

import torch

from pipeline.weight_push.base import (Checksums, FlatLayout, Transport, WeightPushBase, checksums,
                                       flat_layouts, full_tensor, meta_export, without_aliases)

NAME = "cuda_ipc"
_buffer_ids = itertools.count()


@dataclass
class CudaIpcWeights:
    transport: ClassVar[str] = NAME
    # the trainer's buffers hold this version until the next push, which waits for every report:
    # a replacement worker maps them afresh (the header check catches a later version)
    replayable: ClassVar[bool] = True
    version: int
    buffer_id: str                       # changes when the trainer allocates new buffers
    device_uuid: str                     # the GPU the memory lives on
    header: tuple[Any, tuple]            # rebuild fn and its args: int64[1], the version written
    buffers: list[tuple[FlatLayout, Any, tuple]]  # per flat buffer: layout, rebuild fn, its args
    checksums: Checksums | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def tensors(self, state: CudaIpcReceiver) -> Iterator[tuple[str, torch.Tensor]]:
        mapped = state.mapping(self)
        written = int(mapped.header.item())
        if written != self.version:
            raise RuntimeError(f"cuda_ipc buffer {self.buffer_id} holds version {written}, the payload "
                               f"says {self.version}: the trainer wrote it out of order")
        for layout, flat in zip(mapped.layouts, mapped.flats):
            yield from layout.views(flat)

    def finish(self, state: CudaIpcReceiver) -> None:
        # the engine's copies out of the buffers must be done before the trainer may write again
        torch.cuda.synchronize()


@dataclass
class Mapped:
    """A sampler's mapping of one set of trainer buffers (kept until the buffer id changes)."""
    buffer_id: str
    header: torch.Tensor
    layouts: list[FlatLayout]
    flats: list[torch.Tensor]


class CudaIpcReceiver:
    """In a sampler process: the mapping of the trainer's buffers, opened at the first push and
    kept (into vLLM, the push that mapped took 52.9 ms of transport, the later ones 7.4 ms:
    docs/performance.md)."""

    def __init__(self) -> None:
        self.mapped: Mapped | None = None

    def mapping(self, payload: CudaIpcWeights) -> Mapped:
        """The buffers ``payload`` names; a new buffer id (the trainer allocated again) drops the
        old mapping first."""
        if self.mapped is None or self.mapped.buffer_id != payload.buffer_id:
            self.mapped = None
            self.mapped = open_mapping(payload)
        return self.mapped


def open_mapping(payload: CudaIpcWeights) -> Mapped:
    index = local_index(payload.device_uuid)
    torch.cuda.set_device(index)
    header = open_ipc(*payload.header, index)
    flats = [open_ipc(rebuild, args, index) for _, rebuild, args in payload.buffers]
    return Mapped(payload.buffer_id, header, [layout for layout, _, _ in payload.buffers], flats)


class CudaIpcSender:
    """In a trainer rank. With one rank, the copy sources (the rank's local parameter tensors)
    are taken once: FSDP2 keeps each sharded parameter's storage for the model's life and the
    optimiser steps in place, so later pushes skip ``state_dict()`` and DTensor's dispatch (a
    few ms for ~300 entries). They are taken again when the model's parameter objects change.
    With several ranks every push gathers each full tensor (all ranks), and rank 0 copies it in.
    With LoRA (``worker.lora_scales``) every push merges each wrapped weight afresh, one at a time
    (pipeline/trainer/lora.py): the buffers hold merged weights, so there is no source to alias."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.layouts: list[FlatLayout] = []
        self.flats: list[torch.Tensor] = []
        self.header: torch.Tensor | None = None
        self.handles: tuple[Any, list[tuple[FlatLayout, Any, tuple]]] | None = None
        self.buffer_id = ""
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (view in the buffer, source)
        self.signature: tuple[int, ...] = ()

    def _signature(self) -> tuple[int, ...]:
        return tuple(id(p) for p in self.worker.model.parameters())

    def _allocate(self, sd: dict[str, torch.Tensor]) -> None:
        from torch.multiprocessing.reductions import reduce_tensor

        w = self.worker
        self.layouts = flat_layouts(meta_export(sd, w.export_dtype()))
        self.flats, self.header, self.handles = [], None, None
        if w.rank != 0:
            return
        self.flats = [layout.empty(w.device) for layout in self.layouts]
        self.header = torch.full((1,), -1, dtype=torch.int64, device=w.device)
        self.buffer_id = f"{os.getpid()}-{next(_buffer_ids)}"
        if w.device.type == "cuda":  # a CPU rank packs (tests do) but has nothing to hand over
            self.handles = (reduce_tensor(self.header), [(layout, *reduce_tensor(flat))
                                                         for layout, flat in zip(self.layouts, self.flats)])

    @torch.no_grad()
    def pack(self, version: int) -> None:
        """All ranks (with several, each full tensor is an all-gather): copy the weights into the
        buffers (rank 0), then the version into the header behind them, on the same stream."""
        from pipeline.trainer.lora import export_shapes, merged

        w = self.worker
        one_rank, lora = w.world_size == 1, bool(w.lora_scales)
        if lora or not one_rank or not self.pairs or self._signature() != self.signature:
            sd = without_aliases(w.model.state_dict())
            names = export_shapes(sd) if lora else sd
            if {n for layout in self.layouts for n, _, _ in layout.tensors} != set(names):
                self._allocate(names)
            views = {name: view for layout, flat in zip(self.layouts, self.flats)
                     for name, view in layout.views(flat)}
            if one_rank and not lora:
                self.pairs = [(views[name], full_tensor(t)) for name, t in sd.items()]
                self.signature = self._signature()
            else:  # full_tensor is a collective: every rank, in the same order
                items = merged(sd, w.lora_scales, full_tensor) if lora else \
                    ((name, full_tensor(t)) for name, t in sd.items())
                for name, whole in items:
                    if w.rank == 0:
                        views[name].copy_(whole)
        if one_rank and not lora:
            dsts, srcs = zip(*self.pairs)
            torch._foreach_copy_(list(dsts), list(srcs))  # casts to the export dtype as it copies
        if w.rank == 0:
            self.header.fill_(version)

    def send(self, version: int, verify: bool) -> CudaIpcWeights | None:
        """All ranks; rank 0 returns the payload once its stream has finished the copies."""
        w = self.worker
        t0 = time.perf_counter()
        self.pack(version)
        if w.rank != 0:
            return None
        torch.cuda.current_stream(w.device).synchronize()
        t1 = time.perf_counter()
        sums = None
        if verify:  # of the buffers: exactly what the samplers will read
            sums = checksums([pair for layout, flat in zip(self.layouts, self.flats)
                              for pair in layout.views(flat)])
        t2 = time.perf_counter()
        header, buffers = self.handles
        return CudaIpcWeights(version, self.buffer_id, device_uuid(w.device), header, buffers, sums,
                              {"pack_s": t1 - t0, "checksum_s": t2 - t1})


class CudaIpcPush(WeightPushBase):
    transport = NAME

    async def _send(self, version: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        t0 = time.perf_counter()
        payload = await self._senders("send", version, self.verify)
        timings = dict(payload.timings, trainer_call_s=time.perf_counter() - t0)
        return timings, await self.samplers.receive_weights(payload, version)


TRANSPORT = Transport(NAME, CudaIpcPush, CudaIpcSender, CudaIpcReceiver)


# ---- helpers --------------------------------------------------------------------------------
def device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def local_index(uuid: str) -> int:
    """Index of the GPU with ``uuid`` among this process's visible devices."""
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    raise RuntimeError(f"CUDA IPC weights live on GPU {uuid}, which this process cannot see "
                       "(cuda_ipc needs sampler and trainer on the same GPU)")


def open_ipc(rebuild: Any, args: tuple, device_index: int) -> torch.Tensor:
    """Map a trainer buffer from its ``reduce_tensor`` output. The device index recorded there
    (``rebuild_cuda_tensor``'s ``storage_device``) is the trainer's, which under another
    CUDA_VISIBLE_DEVICES names another GPU or none: put this process's index of that GPU."""
    import inspect

    args = list(args)
    args[list(inspect.signature(rebuild).parameters).index("storage_device")] = device_index
    return rebuild(*args)
