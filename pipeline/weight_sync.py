"""Trainer -> sampler weight transfer, versioned. Three transports, one receiving side.

* ``object_store`` (CPU, or anything): trainer rank 0 gathers the full HF-named state dict, puts
  it in the Ray object store once as buckets; every sampler fetches the same objects.
* ``cuda_ipc`` (sampler and trainer on the same GPU): rank 0 keeps each bucket on the GPU and
  sends CUDA IPC handles (``torch.multiprocessing.reductions.reduce_tensor``); the sampler maps
  the same memory and copies it into its engine: no host round trip.
* ``broadcast`` (separate GPUs / nodes): a process group of its own (TCPStore + NCCL, or gloo on
  CPU) joining trainer rank 0 (rank 0 of that group) and every sampler worker; each bucket is one
  flat tensor broadcast from rank 0.

Trainer side: functions taking a :class:`~pipeline.trainer.worker.TrainerWorker` (called inside
the actor through ``TrainerWorker.run(name, ...)``). Sampler side: :class:`WeightReceiver` turns
any payload into ``(name, tensor)`` pairs for ``Engine.load_weights``; a sampler actor mixes in
:class:`WeightReceiverMixin` to expose the broadcast group set-up as actor methods.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator

import torch

TRANSPORTS = ("auto", "object_store", "cuda_ipc", "broadcast")


# ---- payloads (plain data: they cross Ray) --------------------------------------------------
@dataclass
class ObjectStoreWeights:
    version: int
    buckets: list[Any]                   # ObjectRefs, each to a list[(name, tensor)]


@dataclass
class CudaIpcWeights:
    version: int
    handles: list[tuple[str, Any, tuple]]  # (name, rebuild function, its args)
    device_uuid: str                     # the GPU the memory lives on


@dataclass
class BroadcastWeights:
    version: int
    # per bucket: dtype name and [(name, shape)] in flat order
    buckets: list[tuple[str, list[tuple[str, tuple[int, ...]]]]] = field(default_factory=list)


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


# ---- trainer side ---------------------------------------------------------------------------
def _device_uuid() -> str:
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def ipc_prepare(worker: Any) -> int:
    """All ranks: plan the buckets from the (sharded) state dict, without gathering anything.
    Returns the bucket count; ``ipc_bucket`` then materialises one bucket at a time, so the GPU
    the pools share never holds a second full copy of the model."""
    limit = worker.cfg.weight_bucket_mb * 2**20
    size = torch.tensor([], dtype=worker.export_dtype()).element_size()
    layout: list[list[str]] = [[]]
    used = 0
    for name, t in worker.model.state_dict().items():
        nbytes = t.numel() * (size if t.is_floating_point() else t.element_size())
        if layout[-1] and used + nbytes > limit:
            layout.append([])
            used = 0
        layout[-1].append(name)
        used += nbytes
    worker._ipc_layout, worker._ipc_live = layout, []
    return len(layout)


def ipc_bucket(worker: Any, i: int, version: int) -> CudaIpcWeights | None:
    """All ranks (each full tensor is an all-gather): bucket i on the GPU; rank 0 returns its
    IPC handles. The tensors stay referenced until the next bucket replaces them."""
    from torch.distributed.tensor import DTensor
    from torch.multiprocessing.reductions import reduce_tensor

    sd = worker.model.state_dict()
    dtype = worker.export_dtype()
    live = []
    for name in worker._ipc_layout[i]:
        t = sd[name]
        t = t.full_tensor() if isinstance(t, DTensor) else t
        t = t.detach().to(device=worker.device, dtype=dtype if t.is_floating_point() else t.dtype)
        live.append((name, t.contiguous()))
    worker._ipc_live = live
    if worker.rank != 0:
        return None
    handles = []
    for name, t in live:
        fn, args = reduce_tensor(t)
        handles.append((name, fn, args))
    return CudaIpcWeights(version, handles, _device_uuid())


def ipc_release(worker: Any) -> None:
    worker._ipc_live = []
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def broadcast_init(worker: Any, host: str, port: int, world_size: int, timeout_s: float) -> None:
    """Rank 0 joins the weight group as its rank 0 (the store's master). Other ranks: no-op."""
    if worker.rank == 0:
        worker._weight_group = _new_group(host, port, 0, world_size, timeout_s)


def broadcast_prepare(worker: Any, version: int) -> BroadcastWeights | None:
    """All ranks: gather. Rank 0 flattens the buckets and returns their layout."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    on_gpu = worker.device.type == "cuda"
    sd = get_model_state_dict(worker.model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=not on_gpu))
    if worker.rank != 0:
        return None
    flats, meta = [], BroadcastWeights(version)
    for bucket in worker.buckets(sd):
        dtype = bucket[0][1].dtype
        layout = [(n, tuple(t.shape)) for n, t in bucket]
        if any(t.dtype != dtype for _, t in bucket):  # mixed dtypes: one tensor per bucket
            for n, t in bucket:
                flats.append(t.reshape(-1).contiguous())
                meta.buckets.append((str(t.dtype).removeprefix("torch."), [(n, tuple(t.shape))]))
            continue
        flats.append(torch.cat([t.reshape(-1) for _, t in bucket]).to(worker.device))
        meta.buckets.append((str(dtype).removeprefix("torch."), layout))
    worker._broadcast_flats = flats
    return meta


def broadcast_send(worker: Any) -> float:
    """Rank 0: send every prepared bucket; returns seconds spent."""
    if worker.rank != 0:
        return 0.0
    t0 = time.perf_counter()
    for flat in worker._broadcast_flats:
        _broadcast(worker._weight_group, flat)
    worker._broadcast_flats = []
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


# ---- shared helpers -------------------------------------------------------------------------
def _new_group(host: str, port: int, rank: int, world_size: int, timeout_s: float) -> Any:
    """A process group independent of any default group (the trainer already has one)."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout)
    store = dist.PrefixStore("weight_sync", store)
    if torch.cuda.is_available():
        return dist.ProcessGroupNCCL(store, rank, world_size)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


# ---- sampler side ---------------------------------------------------------------------------
class WeightReceiver:
    """Lives in a sampler process; turns payloads into named tensors for ``Engine.load_weights``."""

    def __init__(self) -> None:
        self.group: Any = None
        self.rank = -1

    def join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        self.group, self.rank = _new_group(host, port, rank, world_size, timeout_s), rank

    def named_tensors(self, payload: Any) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(payload, ObjectStoreWeights):
            import ray

            for bucket in payload.buckets:
                # a nested ref arrives unresolved; top-level lists of refs as well
                yield from (ray.get(bucket) if isinstance(bucket, ray.ObjectRef) else bucket)
        elif isinstance(payload, CudaIpcWeights):
            if torch.cuda.is_available():
                torch.cuda.set_device(_local_index(payload.device_uuid))
            for name, fn, args in payload.handles:
                args = list(args)
                args[6] = _local_index(payload.device_uuid)  # the device index as this process sees it
                yield name, fn(*args)
        elif isinstance(payload, BroadcastWeights):
            if self.group is None:
                raise RuntimeError("broadcast weights arrived before join(): the sampler is not "
                                   "in the weight group")
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
                else torch.device("cpu")
            for dtype_name, layout in payload.buckets:
                dtype = getattr(torch, dtype_name)
                numel = sum(_numel(shape) for _, shape in layout)
                flat = torch.empty(numel, dtype=dtype, device=device)
                _broadcast(self.group, flat)
                offset = 0
                for name, shape in layout:
                    n = _numel(shape)
                    yield name, flat[offset:offset + n].view(shape)
                    offset += n
        elif isinstance(payload, dict):
            yield from payload.items()
        else:
            yield from payload  # already (name, tensor) pairs


class WeightReceiverMixin:
    """For a sampler Ray actor: ``join_weight_group`` as an actor method, ``weights_of(payload)``."""

    def join_weight_group(self, host: str, port: int, rank: int, world_size: int,
                          timeout_s: float = 600.0) -> None:
        self._weight_receiver().join(host, port, rank, world_size, timeout_s)

    def weights_of(self, payload: Any) -> Iterator[tuple[str, torch.Tensor]]:
        return self._weight_receiver().named_tensors(payload)

    def _weight_receiver(self) -> WeightReceiver:
        if getattr(self, "_receiver", None) is None:
            self._receiver = WeightReceiver()
        return self._receiver


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _local_index(uuid: str) -> int:
    """Index of the GPU with ``uuid`` among this process's visible devices."""
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    raise RuntimeError(f"CUDA IPC weights live on GPU {uuid}, which this process cannot see "
                       "(cuda_ipc needs sampler and trainer on the same GPU)")


# ---- driver side ----------------------------------------------------------------------------
class WeightSync:
    """Pushes the trainer's weights to every sampler with a version number; times each push.

    ``samplers`` is the sampler pool: ``await samplers.update_weights(payload, version)`` hands a
    payload to every worker, and (broadcast only) ``samplers.workers`` are actors with
    ``join_weight_group`` (:class:`WeightReceiverMixin`).
    """

    def __init__(self, trainer: Any, samplers: Any, transport: str, timeout_s: float = 600.0) -> None:
        self.trainer, self.samplers, self.transport = trainer, samplers, transport
        self.timeout_s = timeout_s
        self.last_s = 0.0
        self._group_restarts = -1  # the sampler pool's restart count when the group was formed
        if transport == "broadcast":
            self._form_group()

    def _form_group(self) -> None:
        """A weight group of trainer rank 0 and every sampler worker, on a fresh port (blocking).

        Formed again whenever the pool has replaced a worker since: the replacement is not in the
        old group, whose world size still counts the lost one, so a broadcast there would hang.
        """
        import ray

        host, port = ray.get(self.trainer.workers[0].address.remote())
        world = 1 + len(self.samplers.workers)
        joins = [w.join_weight_group.remote(host, port, 1 + i, world, self.timeout_s)
                 for i, w in enumerate(self.samplers.workers)]
        self.trainer.run_all("broadcast_init", host, port, world, self.timeout_s)
        ray.get(joins)
        self._group_restarts = getattr(self.samplers, "restarts", 0)

    async def push(self, version: int) -> float:
        t0 = time.perf_counter()
        if self.transport == "broadcast" and getattr(self.samplers, "restarts", 0) != self._group_restarts:
            await asyncio.to_thread(self._form_group)
        if self.transport == "object_store":
            refs = await _gather(self.trainer.workers, "export_to_object_store")
            await self.samplers.update_weights(ObjectStoreWeights(version, refs[0]), version)
        elif self.transport == "cuda_ipc":
            counts = await _gather(self.trainer.workers, "run", "ipc_prepare")
            for i in range(counts[0]):
                payloads = await _gather(self.trainer.workers, "run", "ipc_bucket", i, version)
                await self.samplers.update_weights(payloads[0], version)
            await _gather(self.trainer.workers, "run", "ipc_release")
        elif self.transport == "broadcast":
            metas = await _gather(self.trainer.workers, "run", "broadcast_prepare", version)
            send = self.trainer.workers[0].run.remote("broadcast_send")
            await self.samplers.update_weights(metas[0], version)
            await send
        else:
            raise ValueError(f"unknown weight transport {self.transport!r}")
        self.last_s = time.perf_counter() - t0
        return self.last_s


async def _gather(actors: list[Any], method: str, *args: Any) -> list[Any]:
    return list(await asyncio.gather(*[getattr(a, method).remote(*args) for a in actors]))
