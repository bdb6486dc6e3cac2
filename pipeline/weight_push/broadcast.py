"""``broadcast`` (separate GPUs or nodes): a process group of its own (TCPStore + NCCL, or gloo on
CPU) joining trainer rank 0 (rank 0 of that group) and every sampler worker; each flat buffer
(one per bucket and dtype) is broadcast from rank 0 while the samplers copy the previous one in."""
from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

import torch

from pipeline.parts import LOSSES_PER_CALL, PushInterrupted
from pipeline.weight_push.base import (Checksums, FlatLayout, Transport, WeightPushBase, broadcast,
                                       checksums, flat_layouts, gathered_without_aliases, meta_export,
                                       new_group, pack)

NAME = "broadcast"


@dataclass
class BroadcastWeights:
    transport: ClassVar[str] = NAME
    # the tensors travel once, inside a group collective: a worker started later cannot fetch them
    replayable: ClassVar[bool] = False
    version: int
    buffers: list[FlatLayout] = field(default_factory=list)  # in broadcast order
    checksums: Checksums | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def tensors(self, state: BroadcastReceiver) -> Iterator[tuple[str, torch.Tensor]]:
        if state.group is None:
            raise RuntimeError("broadcast weights arrived before join(): the sampler is not in the "
                               "weight group")
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        for layout in self.buffers:
            flat = layout.empty(device)
            broadcast(state.group, flat)
            yield from layout.views(flat)

    def finish(self, state: BroadcastReceiver) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()


class BroadcastReceiver:
    """In a sampler process: its membership of the weight group (rank 1 + its worker index)."""

    def __init__(self) -> None:
        self.group: Any = None
        self.rank = -1

    def join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        self.group, self.rank = new_group(host, port, rank, world_size, timeout_s), rank


class BroadcastSender:
    """In a trainer rank: rank 0 is rank 0 of the weight group; the others only join the gather."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.group: Any = None
        self.flats: list[torch.Tensor] = []

    def join(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Rank 0 joins the weight group as its rank 0 (the store's master). Other ranks: no-op."""
        if self.worker.rank == 0:
            self.group = new_group(host, port, 0, world_size, timeout_s)

    def prepare(self, version: int, verify: bool) -> BroadcastWeights | None:
        """All ranks: gather. Rank 0 packs the buckets into flat buffers and returns their layouts."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        w = self.worker
        t0 = time.perf_counter()
        on_gpu = w.device.type == "cuda"
        sd = get_model_state_dict(w.model, options=StateDictOptions(full_state_dict=True,
                                                                    cpu_offload=not on_gpu))
        if w.rank != 0:
            return None
        sd = gathered_without_aliases(w.model, sd)  # a tied weight goes once, as with cuda_ipc
        if w.lora_scales:  # merged under the base names (pipeline/trainer/lora.py)
            from pipeline.trainer.lora import merged

            sd = dict(merged(sd, w.lora_scales))
        layouts = [layout for bucket in w.buckets(dict(meta_export(sd, w.export_dtype())))
                   for layout in flat_layouts(bucket)]
        self.flats = pack(layouts, sd.__getitem__, w.device)
        t1 = time.perf_counter()
        sums = None
        if verify:
            sums = checksums([pair for layout, flat in zip(layouts, self.flats) for pair in layout.views(flat)])
        return BroadcastWeights(version, layouts, sums, {"pack_s": t1 - t0,
                                                         "checksum_s": time.perf_counter() - t1})

    def send(self) -> float:
        """Rank 0: send every prepared buffer; returns seconds spent."""
        if self.worker.rank != 0:
            return 0.0
        t0 = time.perf_counter()
        try:
            for flat in self.flats:
                broadcast(self.group, flat)
        except Exception:
            # a member was lost mid-collective: the group is dropped (its connections close, so
            # the members still waiting for a buffer fail instead of waiting for the timeout)
            self.group = None
            raise
        finally:
            self.flats = []
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t0


class BroadcastPush(WeightPushBase):
    """Forms the weight group at start, and again whenever the sampler group has replaced a worker or the
    trainer group has restarted since: the new process is not in the old group, whose world size
    still counts the lost one, so a broadcast there would hang."""
    transport = NAME

    def __init__(self, trainer: Any, samplers: Any, timeout_s: float, verify: bool = True) -> None:
        super().__init__(trainer, samplers, timeout_s, verify)
        self._group_restarts = (-1, -1)  # (sampler group, trainer group) restarts when it was formed
        self._form_group()

    def _form_group(self) -> None:
        """A weight group of trainer rank 0 and every sampler worker, on a fresh port (blocking)."""
        import ray

        host, port = self.trainer.rank0_address()
        world = 1 + len(self.samplers.workers)
        joins = [w.weight_receiver_call.remote(NAME, "join", host, port, 1 + i, world, self.timeout_s)
                 for i, w in enumerate(self.samplers.workers)]
        ray.get(self.trainer.weight_sender_call(NAME, "join", host, port, world, self.timeout_s))
        ray.get(joins)
        self._group_restarts = self._restarts()

    def _restarts(self) -> tuple[int, int]:
        return self.samplers.restarts, self.trainer.restarts  # a replaced worker is not in the group

    async def prepare(self, version: int) -> BroadcastWeights:
        """Every rank gathers; rank 0 packs the buffers and answers their layouts."""
        return await self._senders("prepare", version, self.verify)

    async def _send(self, version: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        for attempt in range(LOSSES_PER_CALL + 1):
            if self._restarts() != self._group_restarts:
                await asyncio.to_thread(self._form_group)
            payload = await self.prepare(version)
            send = asyncio.ensure_future(self._senders("send"))
            try:
                reports = await self.samplers.receive_weights(payload, version)
            except PushInterrupted as e:
                # the sender fails (or ends) on the broken group and drops it, which ends the
                # survivors' receives; then a new group with the replacement gets the push again
                try:
                    await send
                except Exception:
                    pass
                if attempt == LOSSES_PER_CALL:
                    raise
                print(f"[weight_push] broadcast of version {version}: {e}; forming the group again",
                      file=sys.stderr, flush=True)
                continue
            timings = dict(payload.timings, send_s=await send)
            return timings, reports
        raise AssertionError("unreachable")


TRANSPORT = Transport(NAME, BroadcastPush, BroadcastSender, BroadcastReceiver)
