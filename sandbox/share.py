"""Tensors shared between the judge and a runner without a copy through a file, and the channel
that carries their descriptors.

On a GPU a tensor goes by CUDA IPC: torch's own ``_share_cuda_`` on the producer and
``_new_shared_cuda`` on the consumer (the pieces ``torch.multiprocessing`` pickles; here they travel
as checked JSON, since nothing a candidate sends is ever unpickled). The consumer's stream waits on
the producer's IPC event, so a judge reading a runner's output reads it after the work the runner
queued before sharing it. On the CPU a tensor goes as a sealed ``memfd`` (``SCM_RIGHTS``): a runner
seals its output (no writes, no resize) before passing it, so nothing it does after its answer can
change what the judge reads.

Hand-written because torch.multiprocessing's reductions unpickle what they receive, and pickle
from a candidate's process would run the candidate's code in the judge.
"""
from __future__ import annotations

import base64
import fcntl
import json
import mmap
import os
import select
import socket
import struct
import time
from typing import Any

import torch

from sandbox.wire import DESCRIPTOR_KEYS, MAX_DIMS, MAX_HANDLE_BYTES, MAX_MESSAGE_BYTES, Forged

_F_ADD_SEALS, _F_GET_SEALS = 1033, 1034
_F_SEAL_SEAL, _F_SEAL_SHRINK, _F_SEAL_GROW, _F_SEAL_WRITE, _F_SEAL_FUTURE_WRITE = 1, 2, 4, 8, 16
_SEALED = _F_SEAL_SHRINK | _F_SEAL_GROW | _F_SEAL_WRITE
_MAX_FDS = 64
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128)}


class Channel:
    """Length-prefixed JSON messages over one end of a socket pair, with file descriptors attached."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, obj: Any, fds: list[int] = ()) -> None:  # type: ignore[assignment]
        body = json.dumps(obj).encode()
        data = struct.pack("<I", len(body)) + body
        sent = socket.send_fds(self.sock, [data], list(fds)) if fds else self.sock.send(data)
        if sent < len(data):
            self.sock.sendall(data[sent:])

    def recv(self, deadline: float | None) -> tuple[Any, list[int]]:
        """(message, passed fds). TimeoutError past ``deadline``, EOFError when the peer is gone,
        :class:`Forged` for a frame the protocol never sends."""
        fds: list[int] = []
        head = self._read(4, deadline, fds)
        (size,) = struct.unpack("<I", head)
        if size > MAX_MESSAGE_BYTES:
            _close_all(fds)
            raise Forged(f"a message of {size} bytes")
        body = self._read(size, deadline, fds)
        try:
            return json.loads(body), fds
        except (ValueError, UnicodeDecodeError):
            _close_all(fds)
            raise Forged("a message that is not JSON") from None

    def _read(self, n: int, deadline: float | None, fds: list[int]) -> bytes:
        buf = b""
        while len(buf) < n:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                raise TimeoutError
            chunk, got, _flags, _addr = socket.recv_fds(self.sock, n - len(buf), _MAX_FDS)
            fds.extend(got)
            if len(fds) > _MAX_FDS:
                _close_all(fds)
                raise Forged("too many descriptors")
            if not chunk:
                raise EOFError
            buf += chunk
        return buf


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# --- export (the side that owns the memory) -----------------------------------------------------

def export(values: list[Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """Descriptors of ``values`` (tensors shared, plain numbers as values) and the fds to pass."""
    descs, fds = [], []
    for v in values:
        if isinstance(v, torch.Tensor):
            descs.append(_export_tensor(v.detach(), fds))
        elif v is None or isinstance(v, (bool, int, float, str)):
            descs.append({"kind": "value", "value": v})
        else:
            raise TypeError(f"cannot share a {type(v).__name__}")
    return descs, fds


def _meta(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "stride": list(t.stride()),
            "offset": t.storage_offset()}


def _export_tensor(t: torch.Tensor, fds: list[int]) -> dict[str, Any]:
    if t.is_cuda:
        (device, handle, size, offset, ref, ref_offset, event, sync) = t.untyped_storage()._share_cuda_()
        return {"kind": "cuda", **_meta(t), "handle": _b64(handle), "storage_bytes": int(size),
                "storage_offset_bytes": int(offset), "ref_counter": _b64(ref), "ref_counter_offset": int(ref_offset),
                "event": _b64(event) if event else None, "event_sync": bool(sync)}
    if t.device.type != "cpu":
        raise TypeError(f"cannot share a tensor on {t.device}")
    fd = sealed_memfd(t)
    fds.append(fd)
    meta = _meta(t.contiguous())
    meta["offset"] = 0
    return {"kind": "memfd", **meta, "nbytes": t.numel() * t.element_size(), "fd": len(fds) - 1}


def sealed_memfd(t: torch.Tensor) -> int:
    """A memfd holding ``t``'s values (contiguous), sealed against writes and resizes."""
    src = t.contiguous()
    nbytes = src.numel() * src.element_size()
    fd = os.memfd_create("sandbox-tensor", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        if nbytes:
            os.ftruncate(fd, nbytes)
            with mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
                dst = torch.frombuffer(m, dtype=torch.uint8, count=nbytes)
                dst.copy_(src.reshape(-1).view(torch.uint8))
                del dst
        fcntl.fcntl(fd, _F_ADD_SEALS, _SEALED | _F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def shared_cpu_buffer(t: torch.Tensor) -> tuple[torch.Tensor, int, mmap.mmap]:
    """A writable shared copy of ``t`` (the judge's input buffer on the CPU): (tensor, fd, mapping).
    The judge rewrites its values between calls; runners map it read-only."""
    nbytes = max(t.numel() * t.element_size(), 1)
    fd = os.memfd_create("sandbox-input", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    fcntl.fcntl(fd, _F_ADD_SEALS, _F_SEAL_SHRINK | _F_SEAL_GROW)
    m = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    # From here on no one can write it but through this mapping: a runner that maps it (even after
    # reopening it through /proc) gets no writable view, so an input cannot be changed in place.
    fcntl.fcntl(fd, _F_ADD_SEALS, _F_SEAL_FUTURE_WRITE)
    buf = _view(m, t.dtype, t.numel()).view(t.shape) if t.numel() else t.clone()
    buf.copy_(t)
    return buf, fd, m


def input_descriptor(t: torch.Tensor, fd_index: int) -> dict[str, Any]:
    return {"kind": "memfd", **_meta(t), "offset": 0, "nbytes": t.numel() * t.element_size(), "fd": fd_index}


def _b64(b: bytes) -> str:
    return base64.b64encode(bytes(b)).decode()


# --- import (the side that reads) ---------------------------------------------------------------

class Imported:
    """What one ``import_all`` opened: keep it while the tensors are in use, then ``close()``."""

    def __init__(self) -> None:
        self.tensors: list[Any] = []
        self.maps: list[mmap.mmap] = []
        self.fds: list[int] = []
        self.regions: list[tuple[str, int, int]] = []   # (allocation id, start byte, end byte) per tensor

    def close(self) -> None:
        self.tensors.clear()
        for m in self.maps:
            try:
                m.close()
            except BufferError:  # a view still alive: the mapping goes with it
                pass
        self.maps.clear()
        _close_all(self.fds)
        self.fds.clear()


def import_all(descs: Any, fds: list[int], device: str, writable: bool = False,
               require_sealed: bool = True) -> Imported:
    """Open the tensors ``descs`` describe; :class:`Forged` for anything malformed. ``fds`` are
    owned by the result from here on."""
    out = Imported()
    out.fds = list(fds)
    try:
        if not isinstance(descs, list) or len(descs) > 256:
            raise Forged("descriptors are not a list")
        for d in descs:
            out.tensors.append(_import_one(d, out, device, writable, require_sealed))
    except BaseException:
        out.close()
        raise
    return out


def _import_one(d: Any, out: Imported, device: str, writable: bool, require_sealed: bool) -> Any:
    if not isinstance(d, dict) or d.get("kind") not in DESCRIPTOR_KEYS or set(d) != DESCRIPTOR_KEYS[d["kind"]]:
        raise Forged("a malformed tensor descriptor")
    if d["kind"] == "value":
        if d["value"] is not None and not isinstance(d["value"], (bool, int, float, str)):
            raise Forged("a non-scalar value")
        out.regions.append(("", 0, 0))
        return d["value"]
    dtype = _DTYPES.get(d["dtype"]) if isinstance(d["dtype"], str) else None
    shape, stride, offset = d["shape"], d["stride"], d["offset"]
    if dtype is None or not _ints(shape) or not _ints(stride) or len(shape) != len(stride) \
            or len(shape) > MAX_DIMS or not _ints([offset]):
        raise Forged("a tensor descriptor with bad dtype, shape or stride")
    item = torch.empty((), dtype=dtype).element_size()
    extent = 0 if 0 in shape else offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    if d["kind"] == "cuda":
        return _import_cuda(d, out, device, dtype, shape, stride, offset, item, extent)
    if not device == "cpu":
        raise Forged("a host tensor where a device tensor was expected")
    if not _ints([d["nbytes"], d["fd"]]) or d["fd"] >= len(out.fds) or extent * item > d["nbytes"]:
        raise Forged("a memfd descriptor whose view does not fit")
    fd = out.fds[d["fd"]]
    seals = fcntl.fcntl(fd, _F_GET_SEALS)
    if require_sealed and seals & _SEALED != _SEALED:
        raise Forged("an output memfd that is not sealed against writes")
    size = os.fstat(fd).st_size
    if size < d["nbytes"]:
        raise Forged("a memfd smaller than it claims")
    st = os.fstat(fd)
    out.regions.append((f"memfd:{st.st_dev}:{st.st_ino}", offset * item, extent * item))
    if d["nbytes"] == 0:
        return torch.empty_strided(shape, stride, dtype=dtype)
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    m = mmap.mmap(fd, d["nbytes"], mmap.MAP_SHARED, prot)
    out.maps.append(m)
    flat = _view(m, dtype, d["nbytes"] // item)
    return flat.as_strided(shape, stride, offset)


def _view(m: mmap.mmap, dtype: torch.dtype, count: int) -> torch.Tensor:
    import warnings

    with warnings.catch_warnings():  # torch warns that a read-only buffer is not writable: as meant
        warnings.simplefilter("ignore")
        return torch.frombuffer(m, dtype=dtype, count=count)


def _import_cuda(d: dict[str, Any], out: Imported, device: str, dtype: torch.dtype, shape: list[int],
                 stride: list[int], offset: int, item: int, extent: int) -> torch.Tensor:
    if not device.startswith("cuda"):
        raise Forged("a device tensor where a host tensor was expected")
    # torch prefixes the CUDA handle with its kind (a cudaMalloc block or expandable segments)
    handle, ref = _unb64(d["handle"], MAX_HANDLE_BYTES), _unb64(d["ref_counter"], 256)
    event = None if d["event"] is None else _unb64(d["event"], MAX_HANDLE_BYTES)
    if not handle or ref is None or not _ref_name_ok(ref) \
            or (d["event"] is not None and not event) \
            or not _ints([d["storage_bytes"], d["storage_offset_bytes"], d["ref_counter_offset"]]) \
            or not isinstance(d["event_sync"], bool) or extent * item > d["storage_bytes"]:
        raise Forged("a CUDA IPC descriptor that does not fit")
    out.regions.append((handle.hex(), d["storage_offset_bytes"] + offset * item,
                        d["storage_offset_bytes"] + extent * item))
    storage = torch.UntypedStorage._new_shared_cuda(
        torch.device(device).index or 0, handle, d["storage_bytes"], d["storage_offset_bytes"], ref,
        d["ref_counter_offset"], event, d["event_sync"])
    t = torch.empty(0, dtype=dtype, device=device)
    t.set_(storage, offset, shape, stride)
    return t


def _ref_name_ok(name: bytes) -> bool:
    # torch's ref counter lives in a shared memory file it names itself ("/torch_<pid>_<n>_<m>");
    # a name with a slash past the first would be a path
    text = name.decode("ascii", "replace")
    return text.startswith("/") and "/" not in text[1:] and text[1:].replace("_", "").isalnum()


def _unb64(s: Any, limit: int) -> bytes | None:
    if not isinstance(s, str) or len(s) > 2 * limit + 8:
        return None
    try:
        return base64.b64decode(s, validate=True)
    except ValueError:
        return None


def _ints(xs: Any) -> bool:
    return isinstance(xs, list) and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**48
                                        for x in xs)


def regions_of(descs: list[dict[str, Any]], fds: list[int]) -> list[tuple[str, int, int]]:
    """(allocation, start, end) of each descriptor, from its fields alone (nothing is opened): the
    judge looks for aliasing before it maps anything, since opening its own IPC handle fails."""
    out = []
    for d in descs:
        if not isinstance(d, dict) or d.get("kind") not in ("cuda", "memfd"):
            out.append(("", 0, 0))
            continue
        try:
            item = torch.empty((), dtype=_DTYPES[d["dtype"]]).element_size()
            shape, stride, offset = d["shape"], d["stride"], d["offset"]
            extent = 0 if 0 in shape else offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
            if d["kind"] == "cuda":
                base = int(d["storage_offset_bytes"])
                out.append((bytes(base64.b64decode(d["handle"])).hex(), base + offset * item, base + extent * item))
            else:
                st = os.fstat(fds[d["fd"]])
                out.append((f"memfd:{st.st_dev}:{st.st_ino}", offset * item, extent * item))
        except (KeyError, TypeError, ValueError, IndexError, OSError):
            raise Forged("a malformed tensor descriptor") from None
    return out


def release(descs: Any, fds: list[int], device: str) -> None:
    """Done with outputs that were never opened: close their fds, and on a GPU tell the producer's
    torch that this consumer is gone (its block would otherwise stay allocated for good, waiting
    for a consumer that never comes: torch frees a shared block when its ref counter drops to 0)."""
    _close_all(fds)
    if not device.startswith("cuda") or not isinstance(descs, list):
        return
    for d in descs:
        if not isinstance(d, dict) or d.get("kind") != "cuda":
            continue
        ref = _unb64(d.get("ref_counter"), 256)
        off = d.get("ref_counter_offset")
        if ref is not None and _ref_name_ok(ref) and _ints([off]):
            try:
                torch.UntypedStorage._release_ipc_counter(ref, off, device=torch.device(device))
            except Exception:  # noqa: BLE001 - a forged name: nothing to release
                pass


def overlaps(a: tuple[str, int, int], b: tuple[str, int, int]) -> bool:
    """Do two regions (allocation, start, end) share bytes?"""
    return bool(a[0]) and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def nbytes_of(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
