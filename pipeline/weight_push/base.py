"""What every weight transport shares: the typed contract between the three processes a push
crosses, flat buffers, the tied-weight dedupe and per-tensor checksums.

The contract (one implementation per transport, one file each, registered as a :class:`Transport`):

* a **sender** lives in a trainer rank: ``Sender(worker)`` is made at first use by
  :meth:`~pipeline.trainer.worker.TrainerWorker.weight_sender` and keeps what outlives a push
  (buffers, a process group); the driver reaches its methods through the one generic actor entry
  ``weight_sender_call(transport, method, *args)`` (on every rank, through
  :meth:`~pipeline.trainer.group.TrainerGroup.weight_sender_call`); it turns the rank's weights
  into a payload;
* a **payload** (:class:`Payload`) is plain data that crosses Ray; its ``tensors(state)`` yields
  ``(HF name, tensor)`` pairs inside a sampler process, and ``finish(state)`` runs once the
  engine has copied them; ``state`` is the transport's receiver state in that process;
* a **receiver state** (optional) lives in a sampler process, held by its
  :class:`~pipeline.weight_push.receiver.WeightReceiver` (made at first use, kept across pushes: a
  mapping of the trainer's buffers, a process group); the driver reaches its methods through the
  sampler worker's ``weight_receiver_call(transport, method, *args)``;
* a **push** (:class:`WeightPushBase`) lives in the driver and orders the two sides through
  :class:`~pipeline.trainer.group.TrainerGroup` and the sampler group.

Checksums are written here because no library offers an order-free exact fingerprint that stays
equal when an engine fuses tensors (vLLM's ``qkv_proj`` is ``q_proj``, ``k_proj`` and ``v_proj``
stacked): the sum and the sum of squares of the raw bit patterns, both exact integers.
"""
from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, ClassVar, Iterator, Protocol, runtime_checkable

import torch

# Each tensor starts 16-byte aligned in its flat buffer, so copies out of the views stay vectorised.
_ALIGN_BYTES = 16
# (sum of bits, sum of squared bits, shape, dtype) per HF name: what a sender computed on what it sent
Checksums = dict[str, tuple[int, int, tuple[int, ...], str]]


@runtime_checkable
class Payload(Protocol):
    transport: ClassVar[str]             # the name its Transport is registered under
    replayable: ClassVar[bool]           # can be handed again to a sampler started after the push
    version: int
    checksums: Checksums | None          # of what was sent, when the push verifies
    timings: dict[str, float]            # the sender's own seconds (e.g. pack_s, checksum_s)

    def tensors(self, state: Any) -> Iterator[tuple[str, torch.Tensor]]:
        """Inside the sampler, given its receiver state of this transport (None if the transport
        has none): the named tensors (lazily, bucket by bucket where it can)."""

    def finish(self, state: Any) -> None:
        """Inside the sampler, after the engine has loaded every tensor."""


def replayable(payload: Any) -> bool:
    """Whether ``payload`` can be handed again to a sampler started after the push. Plain
    ``(name, tensor)`` pairs or a state dict (tests hand those over) count as not replayable."""
    return isinstance(payload, Payload) and payload.replayable


@dataclass
class FlatLayout:
    """Where the tensors of one dtype lie in one flat buffer (offsets in elements)."""
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


def meta_export(sd: dict[str, torch.Tensor], dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
    """Meta stand-ins of ``sd`` in the export dtype (floats only): sizing them costs nothing, and a
    sharded state dict is planned at its full shapes without gathering."""
    return [(name, torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device="meta"))
            for name, t in sd.items()]


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


def gathered_without_aliases(model: torch.nn.Module, gathered: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A gathered (full) state dict without a tied weight's second names. A gathered copy no
    longer shares storage between them, so the names come from the model's own state dict."""
    own = model.state_dict()
    kept = without_aliases(own)
    return {name: t for name, t in gathered.items() if name in kept or name not in own}


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A state-dict entry as one whole tensor: a DTensor is gathered from every rank, except on a
    one-device mesh, where the local shard already is the whole tensor and ``full_tensor()``
    would only add a collective and DTensor's dispatch to each of a model's ~300 entries."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t
    return t.to_local() if t.device_mesh.size() == 1 else t.full_tensor()


def new_group(host: str, port: int, rank: int, world_size: int, timeout_s: float) -> Any:
    """A process group independent of any default group (the trainer already has one)."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout)
    store = dist.PrefixStore("weight_push", store)
    if torch.cuda.is_available():
        return dist.ProcessGroupNCCL(store, rank, world_size)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def broadcast(group: Any, tensor: torch.Tensor) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


# ---- checksums ------------------------------------------------------------------------------
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 22  # elements widened to int64 at once: 32 MB of scratch per chunk


@torch.no_grad()
def _bit_sums(t: torch.Tensor) -> torch.Tensor:
    """int64[2] on ``t``'s device: sum and sum of squares of the raw bit patterns. Integer sums
    wrap the same way in any order, so a fused tensor's sums are its parts' sums added."""
    bits = t.detach().contiguous().reshape(-1).view(_BITS[t.element_size()])
    out = torch.zeros(2, dtype=torch.int64, device=t.device)
    for chunk in bits.split(_CHUNK):
        wide = chunk.to(torch.int64)
        out[0] += wide.sum()
        out[1] += (wide * wide).sum()
    return out


def checksums(named: list[tuple[str, torch.Tensor]], device: torch.device | None = None) -> Checksums:
    """Per-tensor checksums, computed where the tensors are, or on ``device`` (a GPU sums a CPU
    copy of a 0.5B model in milliseconds, a CPU core in seconds); one device-to-host copy in all."""
    if not named:
        return {}
    sums = torch.stack([_bit_sums(t if device is None else t.to(device)) for _, t in named]).tolist()
    return {name: (s[0], s[1], tuple(t.shape), str(t.dtype).removeprefix("torch."))
            for (name, t), s in zip(named, sums)}


def compare_checksums(expected: Checksums, engine_tensors: dict[str, torch.Tensor],
                      engine_name: Callable[[str], str] = lambda n: n) -> dict[str, Any]:
    """Compare an engine's tensors with what the trainer sent. ``engine_name`` maps an HF name to
    the engine's tensor holding it (several HF tensors may be stacked in one: their sums add up).
    An engine tensor with more rows than its parts (a vocabulary padded for the kernels) is
    compared on its first rows. Returns ``{"checked", "unchecked", "problems"}``."""
    groups: dict[str, list[str]] = {}
    problems, unchecked = [], []
    for name in expected:
        target = engine_name(name)
        if target not in engine_tensors:
            problems.append(f"{name}: the engine has no tensor {target!r}")
            continue
        groups.setdefault(target, []).append(name)
    named = []
    for target, parts in groups.items():
        t = engine_tensors[target]
        dtypes = {expected[p][3] for p in parts}
        if dtypes != {str(t.dtype).removeprefix("torch.")}:
            unchecked.append(f"{target}: sent as {sorted(dtypes)}, held as {t.dtype}")
            continue
        shapes = [expected[p][2] for p in parts]
        if t.dim() and all(len(s) == t.dim() for s in shapes):
            rows = sum(s[0] for s in shapes)
            if t.shape[0] > rows:
                t = t[:rows]
        named.append((target, t))
    got = checksums(named)
    for target, _ in named:
        parts = groups[target]
        want = [sum(expected[p][i] for p in parts) for i in (0, 1)]
        # the sent sums wrap at 64 bits on the trainer's side as they do here
        want = [((w + 2**63) % 2**64) - 2**63 for w in want]
        if [got[target][0], got[target][1]] != want:
            problems.append(f"{target} (from {', '.join(parts)}): checksum differs from the trainer's")
    return {"checked": len(named), "unchecked": unchecked, "problems": problems}


# ---- driver side ----------------------------------------------------------------------------
class WeightPushBase(ABC):
    """Pushes the trainer's weights to every sampler as a version; times each push.

    ``trainer`` is a :class:`~pipeline.trainer.group.TrainerGroup`; ``samplers`` the sampler group
    (``await samplers.receive_weights(payload, version)`` hands a payload to every worker and
    returns one report each). ``verify``: the sender checksums what it sends and every sampler
    compares its engine's tensors after loading; a difference raises, naming the tensors.

    ``last_stats`` after a push (seconds): ``total_s``; ``load_s``, the slowest engine's copy
    into its model; ``check_s``, the checksums on both sides; ``transport_s``, the rest (the
    trainer's packing, the hand-over, the sampler's mapping or receiving).
    """
    transport: ClassVar[str] = ""

    def __init__(self, trainer: Any, samplers: Any, timeout_s: float, verify: bool = True) -> None:
        self.trainer, self.samplers = trainer, samplers
        self.timeout_s, self.verify = timeout_s, verify
        self.last_s = 0.0
        self.last_stats: dict[str, float] = {}

    @abstractmethod
    async def _send(self, version: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The transport's own push: (the sender's timings, one report per sampler)."""

    async def _senders(self, method: str, *args: Any) -> Any:
        """``method(*args)`` of this transport's sender on every trainer rank (a gather is a
        collective: all ranks take part, and one rank's error ends the wait); rank 0's answer."""
        return (await asyncio.gather(*self.trainer.weight_sender_call(self.transport, method, *args)))[0]

    async def push(self, version: int) -> float:
        t0 = time.perf_counter()
        sender, reports = await self._send(version)
        total = time.perf_counter() - t0
        bad = [f"sampler {i}: {p}" for i, r in enumerate(reports) for p in r.get("problems", [])]
        if bad:
            raise RuntimeError(f"weight push {version} by {self.transport}: the engine's weights differ "
                               "from the trainer's:\n  " + "\n  ".join(bad[:20]))
        load = max((r["load_s"] for r in reports), default=0.0)
        check = sender.get("checksum_s", 0.0) + max((r.get("check_s", 0.0) for r in reports), default=0.0)
        self.last_stats = {"total_s": total, "load_s": load, "check_s": check,
                           "transport_s": max(0.0, total - load - check),
                           "checked_tensors": float(min((r.get("checked", 0) for r in reports), default=0)),
                           **{f"sender_{k}": v for k, v in sender.items()}}
        self.last_s = total
        return total


@dataclass(frozen=True)
class Transport:
    """One transport's parts, registered under ``name`` in :data:`pipeline.weight_push.REGISTRY`:
    the driver's push, the trainer rank's sender (``sender(worker)``) and the sampler process's
    receiver state (``receiver()``; None when the payload carries everything)."""
    name: str
    push: type[WeightPushBase]
    sender: Callable[[Any], Any]
    receiver: Callable[[], Any] | None = None


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
