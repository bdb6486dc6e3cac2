"""Trainer -> sampler weight transfer, versioned. Three transports, one receiving side.

* ``object_store`` (CPU, or anything): trainer rank 0 gathers the full HF-named state dict, puts
  it in the Ray object store once as buckets; every sampler fetches the same objects.
* ``cuda_ipc`` (sampler and trainer on the same GPU): rank 0 packs each bucket into one flat GPU
  buffer per dtype and sends one CUDA IPC handle per buffer
  (``torch.multiprocessing.reductions.reduce_tensor``) with the layout of the tensors in it; the
  sampler maps the buffers and copies views of them into its engine: no host round trip.
* ``broadcast`` (separate GPUs / nodes): a process group of its own (TCPStore + NCCL, or gloo on
  CPU) joining trainer rank 0 (rank 0 of that group) and every sampler worker; each flat buffer
  (one per bucket and dtype, as for ``cuda_ipc``) is broadcast from rank 0.

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
from typing import Any, Callable, Iterator

import torch

TRANSPORTS = ("auto", "object_store", "cuda_ipc", "broadcast")


# ---- payloads (plain data: they cross Ray) --------------------------------------------------
# Each tensor starts 16-byte aligned in its flat buffer, so copies out of the views stay vectorised.
_ALIGN_BYTES = 16


@dataclass
class ObjectStoreWeights:
    version: int
    buckets: list[Any]                   # ObjectRefs, each to a list[(name, tensor)]


@dataclass
class FlatLayout:
    """Where the tensors of one dtype of a bucket lie in one flat buffer (offsets in elements)."""
    dtype: str
    numel: int = 0
    # (name, shape, offset), in buffer order
    tensors: list[tuple[str, tuple[int, ...], int]] = field(default_factory=list)

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty(self.numel, dtype=getattr(torch, self.dtype), device=device)

    def views(self, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The named tensors as views of ``flat``: no copy."""
        for name, shape, offset in self.tensors:
            yield name, flat[offset:offset + _numel(shape)].view(shape)


@dataclass
class CudaIpcWeights:
    version: int
    buffers: list[tuple[FlatLayout, Any, tuple]]  # per flat buffer: layout, rebuild fn, its args
    device_uuid: str                     # the GPU the memory lives on


@dataclass
class BroadcastWeights:
    version: int
    buffers: list[FlatLayout] = field(default_factory=list)  # in broadcast order


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


# ---- flat buffers (cuda_ipc and broadcast) ---------------------------------------------------
def flat_layouts(bucket: list[tuple[str, torch.Tensor]]) -> list[FlatLayout]:
    """One layout per dtype of the bucket, in first-seen order, so non-float tensors keep their
    dtype. Reads shapes and dtypes only: meta tensors and DTensors (global shape) do."""
    by_dtype: dict[torch.dtype, FlatLayout] = {}
    for name, t in bucket:
        layout = by_dtype.setdefault(t.dtype, FlatLayout(str(t.dtype).removeprefix("torch.")))
        align = max(1, _ALIGN_BYTES // t.element_size())
        offset = -(-layout.numel // align) * align
        layout.tensors.append((name, tuple(t.shape), offset))
        layout.numel = offset + t.numel()
    return list(by_dtype.values())


@torch.no_grad()  # a parameter copied in would make the buffer part of the autograd graph
def pack(layouts: list[FlatLayout], tensor_of: Callable[[str], torch.Tensor],
         device: torch.device) -> list[torch.Tensor]:
    """A new flat buffer per layout, each named tensor copied (and cast) into its slice.
    ``tensor_of`` is asked for one name at a time: besides the buffers, only the tensor being
    copied is materialised (for a sharded model, one gathered tensor)."""
    flats = []
    for layout in layouts:
        flat = layout.empty(device)
        for name, view in layout.views(flat):
            view.copy_(tensor_of(name))
        flats.append(flat)
    return flats


def plan_buckets(worker: Any, sd: dict[str, torch.Tensor]) -> list[list[FlatLayout]]:
    """``worker.buckets`` (the object store's split by ``weight_bucket_mb``, in the export
    dtype) applied to meta stand-ins of ``sd``: sizing and casting them costs nothing, and a
    sharded state dict is planned at its full shapes without gathering."""
    meta = {name: torch.empty(t.shape, dtype=t.dtype, device="meta") for name, t in sd.items()}
    return [flat_layouts(bucket) for bucket in worker.buckets(meta)]


# ---- trainer side ---------------------------------------------------------------------------
def _device_uuid() -> str:
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def ipc_prepare(worker: Any) -> int:
    """All ranks: plan the buckets from the (sharded) state dict, without gathering anything.
    Returns the bucket count; ``ipc_bucket`` then materialises one bucket at a time, so the GPU
    the pools share never holds a second full copy of the model."""
    worker._ipc_sd = without_aliases(worker.model.state_dict())
    worker._ipc_plan, worker._ipc_live = plan_buckets(worker, worker._ipc_sd), []
    return len(worker._ipc_plan)


def ipc_bucket(worker: Any, i: int, version: int) -> CudaIpcWeights | None:
    """All ranks (with several, each full tensor is an all-gather): bucket i packed into one flat
    GPU buffer per dtype; rank 0 returns one IPC handle per buffer. The buffers stay referenced until the next
    bucket or ``ipc_release``."""
    from torch.multiprocessing.reductions import reduce_tensor

    # Drop the previous bucket before packing this one, so the GPU holds one bucket, not two.
    # Safe: ``push`` asks for bucket i only once the samplers have loaded bucket i-1, and torch
    # keeps memory a receiver still maps out of reuse until the receiver lets go of it.
    worker._ipc_live = []
    layouts = worker._ipc_plan[i]
    worker._ipc_live = pack(layouts, lambda name: _full(worker._ipc_sd[name]), worker.device)
    if worker.rank != 0:
        return None
    buffers = [(layout, *reduce_tensor(flat)) for layout, flat in zip(layouts, worker._ipc_live)]
    return CudaIpcWeights(version, buffers, _device_uuid())


def ipc_release(worker: Any) -> None:
    worker._ipc_live, worker._ipc_sd = [], None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def ipc_payload_bytes(worker: Any) -> int:
    """Bytes one push carries from this rank's state dict (a tied weight once), in the export
    dtype: what cuda_ipc sends from each rank, and broadcast and the object store from rank 0."""
    itemsize = worker.export_dtype().itemsize
    return sum(t.numel() * itemsize for t in without_aliases(worker.model.state_dict()).values())


def without_aliases(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor under its first name only. A tied model's state dict names the shared weight
    twice (``lm_head.weight`` = ``model.embed_tokens.weight``: 272 MB of a 1.26 GB push of a 0.5B
    bf16 model), and the engines, built from the same config, tie it too: the HF engine's two names
    are one tensor, and vLLM skips ``lm_head`` of a tied model when it loads."""
    from torch.distributed.tensor import DTensor

    seen: set[tuple[int, int, tuple[int, ...], torch.dtype]] = set()
    out = {}
    for name, t in sd.items():
        local = t.to_local() if isinstance(t, DTensor) else t
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape), local.dtype)
        if local.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


def gathered_without_aliases(worker: Any, gathered: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A gathered (full) state dict without a tied weight's second names. A gathered copy no
    longer shares storage between them, so the names come from the model's own state dict."""
    own = worker.model.state_dict()
    kept = without_aliases(own)
    return {name: t for name, t in gathered.items() if name in kept or name not in own}


def _full(t: torch.Tensor) -> torch.Tensor:
    """A state-dict entry as one whole tensor: a DTensor is gathered from every rank, except on a
    one-device mesh, where the local shard already is the whole tensor and ``full_tensor()``
    would only add a collective and DTensor's dispatch to each of a model's ~300 entries."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t
    return t.to_local() if t.device_mesh.size() == 1 else t.full_tensor()


def broadcast_init(worker: Any, host: str, port: int, world_size: int, timeout_s: float) -> None:
    """Rank 0 joins the weight group as its rank 0 (the store's master). Other ranks: no-op."""
    if worker.rank == 0:
        worker._weight_group = _new_group(host, port, 0, world_size, timeout_s)


def broadcast_prepare(worker: Any, version: int) -> BroadcastWeights | None:
    """All ranks: gather. Rank 0 packs the buckets into flat buffers and returns their layouts."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    on_gpu = worker.device.type == "cuda"
    sd = get_model_state_dict(worker.model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=not on_gpu))
    if worker.rank != 0:
        return None
    sd = gathered_without_aliases(worker, sd)  # a tied weight goes once, as with cuda_ipc
    layouts = [layout for bucket in plan_buckets(worker, sd) for layout in bucket]
    worker._broadcast_flats = pack(layouts, sd.__getitem__, worker.device)
    return BroadcastWeights(version, layouts)


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
            index = _local_index(payload.device_uuid)
            torch.cuda.set_device(index)
            for layout, rebuild, args in payload.buffers:
                yield from layout.views(_open_ipc(rebuild, args, index))
        elif isinstance(payload, BroadcastWeights):
            if self.group is None:
                raise RuntimeError("broadcast weights arrived before join(): the sampler is not "
                                   "in the weight group")
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
                else torch.device("cpu")
            for layout in payload.buffers:
                flat = layout.empty(device)
                _broadcast(self.group, flat)
                yield from layout.views(flat)
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


def _open_ipc(rebuild: Any, args: tuple, device_index: int) -> torch.Tensor:
    """Map a trainer buffer from its ``reduce_tensor`` output. The device index recorded there
    (``rebuild_cuda_tensor``'s ``storage_device``) is the trainer's, which under another
    CUDA_VISIBLE_DEVICES names another GPU or none: put this process's index of that GPU."""
    import inspect

    args = list(args)
    args[list(inspect.signature(rebuild).parameters).index("storage_device")] = device_index
    return rebuild(*args)


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
