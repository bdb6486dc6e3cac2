"""The runner's per-call code: what runs inside the judge's timed window.

Everything :func:`bind` returns reaches the functions it calls through references taken when it was
called, which the runner does before any answer is imported: no module attribute, class attribute
or builtin is looked up at call time. An answer runs in this process and can rebind any of those
(from Python, or from C++ through the C API an extension has: ``PyImport_ImportModule`` and
``PyObject_SetAttrString``), and a rebound helper on the timed path made the call cheaper for the
candidate alone (red team A34: 2.76x for an honest ReLU at bc7aee1). Here a rebinding changes
nothing: the channel's framing and JSON, the grad mode, the device fence, the output checks and
the sealed export go through C functions and method descriptors held in this closure. The
reference runner goes through the very same code, so both times carry the same harness cost.

Per-call preparation (the allocation poison, seeding) is the ``prep`` op, answered before the
judge starts its clock; the judge checks the poison from outside (sandbox/host_poison.py). What is
left open (docs/sandbox.md, "Who owns the timed window"): rewriting this closure's cells, code
objects or the method tables of builtin types through the C API.
"""
from __future__ import annotations

import array
import base64
import builtins
import ctypes
import fcntl
import json.decoder
import json.encoder
import mmap
import os
import random
import select
import socket
import struct
from typing import Any, Callable

import torch

from sandbox import protocol, share

_M_PERTURB, _PERTURB_TO_NAN = -6, 0x100   # glibc's allocation poison (sandbox/protocol.py)


def _mallopt() -> Callable[[int, int], int] | None:
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: the NaN fill is all there is
        return None


def _seeders() -> list[Callable[[int], Any]]:
    out: list[Callable[[int], Any]] = [random.seed, torch.manual_seed]
    try:
        import numpy as np

        seed = np.random.seed
        out.append(lambda s: seed(s % (2**32)))
    except ImportError:
        pass
    return out


def bind(sock: socket.socket, role: str, device: str, fence: Callable[[], Any],
         slow: Callable[..., tuple[dict[str, Any], list[int]]]) -> Callable[[dict[str, Any]], None]:
    """The runner's loop, bound now: ``serve(state)`` never returns. ``slow`` handles the ops outside
    any timed window (load, inputs, warm); ``state`` is the runner's (``model``, ``inputs``, ``held``)."""
    b = builtins
    _len, _isinstance, _int, _list, _tuple, _range, _min, _max, _bytes = (
        b.len, b.isinstance, b.int, b.list, b.tuple, b.range, b.min, b.max, b.bytes)
    _bool, _dict, _type, _enumerate = b.bool, b.dict, b.type, b.enumerate
    _BaseException, _KeyError, _EOFError, _StepError = b.BaseException, b.KeyError, b.EOFError, protocol.StepError
    _exit, _close, _memfd_create, _ftruncate = os._exit, os.close, os.memfd_create, os.ftruncate
    _mmap, _fcntl, _b64encode = mmap.mmap, fcntl.fcntl, base64.b64encode
    _recvmsg, _sendmsg = sock.recvmsg, sock.sendmsg
    # The answer can make this socket non-blocking (O_NONBLOCK is shared by every dup of it: the
    # key seeker of tests/sandbox/test_verdict_line.py peeks at its fds that way), so every read and
    # write waits for readiness first and retries what the kernel refused, as share.Channel does.
    _BlockingIOError = b.BlockingIOError
    _in, _out = select.poll(), select.poll()
    _in.register(sock.fileno(), select.POLLIN)
    _out.register(sock.fileno(), select.POLLOUT)
    _wait_in, _wait_out = _in.poll, _out.poll
    _array = array.array
    _pack, _unpack = struct.Struct("<I").pack, struct.Struct("<I").unpack
    _scan = json.decoder.JSONDecoder().scan_once           # the C scanner, its context bound now

    def _no_default(o: Any) -> Any:
        raise TypeError(f"not JSON: {type(o).__name__}")

    if json.encoder.c_make_encoder is not None:  # the C encoder, its settings bound now
        _encode = json.encoder.c_make_encoder(None, _no_default, json.encoder.encode_basestring_ascii, None,
                                              ": ", ", ", False, False, True)
    else:
        _encode = json.JSONEncoder(default=_no_default).iterencode
    _join = "".join
    _ANC = socket.CMSG_SPACE(64 * 4)
    _SOL, _RIGHTS = socket.SOL_SOCKET, socket.SCM_RIGHTS
    _SEALED = share._F_SEAL_SHRINK | share._F_SEAL_GROW | share._F_SEAL_WRITE | share._F_SEAL_SEAL
    _ADD_SEALS, _MEMFD_FLAGS = share._F_ADD_SEALS, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    _MAP_SHARED, _PROT = mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
    TB, SB = torch._C.TensorBase, torch._C.StorageBase
    _Tensor, _u8, _f32 = torch.Tensor, torch.uint8, torch.float32
    _contig, _numel, _esize, _reshape, _view, _copy, _fill = (
        TB.contiguous, TB.numel, TB.element_size, TB.reshape, TB.view, TB.copy_, TB.fill_)
    _stride, _soff, _ustorage, _detach = TB.stride, TB.storage_offset, TB.untyped_storage, TB.detach
    _dtype, _shape, _is_cuda = TB.dtype.__get__, TB.shape.__get__, TB.is_cuda.__get__
    _sdata_ptr, _snbytes, _share_cuda = SB.data_ptr, SB.nbytes, SB._share_cuda_
    _frombuffer, _empty = torch.frombuffer, torch.empty
    _grad_on, _set_grad = torch._C.is_grad_enabled, torch._C._set_grad_enabled
    _names = {d: n for n, d in share._DTYPES.items()}
    _runtime_kind, _describe = protocol.memory_or_runtime, protocol.describe_exception
    _mallopt_f, _seed_fns = _mallopt(), _seeders()
    on_cuda, nan = device.startswith("cuda"), float("nan")
    _peak = torch.cuda.max_memory_allocated if on_cuda and role == "reference" else None

    def recv() -> tuple[Any, list[int]]:
        fds: list[int] = []

        def read(n: int) -> bytes:
            buf = b""
            while _len(buf) < n:
                _wait_in()
                try:
                    data, anc, _flags, _addr = _recvmsg(n - _len(buf), _ANC)
                except _BlockingIOError:
                    continue
                for level, kind, payload in anc:
                    if level == _SOL and kind == _RIGHTS:
                        got = _array("i")
                        got.frombytes(payload[: _len(payload) - _len(payload) % 4])
                        fds.extend(got)
                if not data:
                    raise _EOFError
                buf += data
            return buf

        (size,) = _unpack(read(4))
        return _scan(read(size).decode(), 0)[0], fds

    def send(obj: Any, fds: list[int]) -> None:
        body = _join(_encode(obj, 0)).encode()
        data = _pack(_len(body)) + body
        anc = [(_SOL, _RIGHTS, _array("i", fds))] if fds else []
        while data:
            _wait_out()
            try:
                sent = _sendmsg([data], anc)
            except _BlockingIOError:
                continue
            data, anc = data[sent:], []  # the fds go with the first bytes

    def meta(t: Any) -> dict[str, Any]:
        return {"dtype": _names[_dtype(t)], "shape": _list(_shape(t)), "stride": _list(_stride(t)),
                "offset": _soff(t)}

    def sealed(t: Any) -> int:  # share.sealed_memfd, through the references above
        src = _contig(t)
        nbytes = _numel(src) * _esize(src)
        fd = _memfd_create("sandbox-tensor", _MEMFD_FLAGS)
        try:
            if nbytes:
                _ftruncate(fd, nbytes)
                m = _mmap(fd, nbytes, _MAP_SHARED, _PROT)
                try:
                    dst = _frombuffer(m, dtype=_u8, count=nbytes)
                    _copy(dst, _view(_reshape(src, -1), _u8))
                    del dst
                finally:
                    m.close()
            _fcntl(fd, _ADD_SEALS, _SEALED)
        except _BaseException:
            _close(fd)
            raise
        return fd

    def export(outs: list[Any]) -> tuple[list[dict[str, Any]], list[int]]:  # share.export, for tensors
        descs: list[dict[str, Any]] = []
        fds: list[int] = []
        for v in outs:
            t = _detach(v)
            if _is_cuda(t):
                (_d, handle, size, offset, ref, ref_off, event, sync) = _share_cuda(_ustorage(t))
                descs.append({"kind": "cuda", **meta(t), "handle": _b64encode(_bytes(handle)).decode(),
                              "storage_bytes": _int(size), "storage_offset_bytes": _int(offset),
                              "ref_counter": _b64encode(_bytes(ref)).decode(), "ref_counter_offset": _int(ref_off),
                              "event": _b64encode(_bytes(event)).decode() if event else None,
                              "event_sync": _bool(sync)})
                continue
            fds.append(sealed(t))
            d = {"kind": "memfd", **meta(_contig(t)), "nbytes": _numel(t) * _esize(t), "fd": _len(fds) - 1}
            d["offset"] = 0
            descs.append(d)
        return descs, fds

    def span(t: Any) -> tuple[int, int]:
        s = _ustorage(t)
        start = _sdata_ptr(s)
        return start, start + _snbytes(s)

    def aliasing(outs: list[Any], inputs: list[Any]) -> tuple[str, str] | None:  # runner._aliasing
        ins = [span(x) for x in inputs if _isinstance(x, _Tensor) and _numel(x)]
        seen: list[tuple[int, int]] = []
        for i, t in _enumerate(outs):
            if not _numel(t):
                continue
            a = span(t)
            for s in ins:
                if a[0] < s[1] and s[0] < a[1]:
                    return "output_aliases_input", f"output {i} shares memory with an input: outputs must be new tensors"
            for s in seen:
                if a[0] < s[1] and s[0] < a[1]:
                    return "output_aliases_output", f"output {i} shares memory with another output"
            seen.append(a)
        return None

    def prep(msg: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """Outside the judge's clock: drop the last outputs, poison, seed (what a call used to do first)."""
        state["held"] = []
        poison = msg.get("poison", 0)
        poison = poison if _isinstance(poison, _int) else 0
        host = _mallopt_f is not None and _mallopt_f(_M_PERTURB, _PERTURB_TO_NAN if poison else 0)
        if poison > 0 and (on_cuda or not host):  # a fill of NaN, freed: the device's allocator (or not glibc)
            chunk = poison if on_cuda else 16 << 20
            for start in _range(0, poison, chunk):
                buf = _empty(_max((_min(chunk, poison - start)) // 4, 1), dtype=_f32, device=device)
                _fill(buf, nan)
                del buf
            fence()
        rng = msg.get("rng")
        if _isinstance(rng, _int):
            for seed in _seed_fns:
                seed(rng)
        return {"ok": True}

    def call(msg: dict[str, Any], state: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        inputs = state["tensors"][msg.get("set", 0)]
        state["held"] = []
        was = _grad_on()
        _set_grad(False)
        try:
            out = state["model"](*inputs)
        finally:
            _set_grad(was)
        fence()
        outs = _list(out) if _isinstance(out, (_tuple, _list)) else [out]
        for i, item in _enumerate(outs):
            if not _isinstance(item, _Tensor):
                return {"ok": False, "kind": "wrong_output", "stage": "correctness",
                        "error": f"{role} output {i} is a {_type(item).__name__}, expected a tensor"}, []
        state["held"] = outs
        alias = aliasing(outs, inputs)
        if alias:
            return {"ok": False, "kind": "rule_violation", "flag": alias[0], "error": alias[1],
                    "stage": "correctness"}, []
        descs, fds = export(outs)
        try:
            fence()
        except _BaseException:
            for fd in fds:
                _close(fd)
            raise
        reply: dict[str, Any] = {"ok": True, "outputs": descs}
        # only where the judge asks (never in a timed call): torch.cuda.max_memory_allocated builds
        # the allocator's whole stats dict, work only the reference's calls did on the clock. On the
        # H100 (2026-12-07, bench.timing_order) the reference's own copy ran 0.38-0.42 ms as the
        # candidate and 0.50-0.58 ms as the reference in every window, alive or after the kill: an
        # asymmetry of the runners, not of the order; this was the one found in the call path
        if _peak is not None and msg.get("peak") is True:
            reply["peak_bytes"] = _int(_peak())
        return reply, fds

    def serve(state: dict[str, Any]) -> None:
        state.setdefault("tensors", {})
        while True:
            try:
                msg, fds = recv()
            except _BaseException:  # the judge is gone, or sent what it never sends
                _exit(0)
            op = msg.get("op") if _isinstance(msg, _dict) else None
            if op == "stop" or op is None:
                _exit(0)
            out_fds: list[int] = []
            try:
                if op == "call":
                    reply, out_fds = call(msg, state)
                elif op == "prep":
                    reply = prep(msg, state)
                elif op == "ping":  # the judge's measure of a bare round trip
                    reply = {"ok": True}
                else:
                    reply, out_fds = slow(op, msg, fds, state)
                    if op == "inputs" and reply.get("ok"):  # the tensors, held here for the calls
                        k = _int(msg.get("set", 0))
                        state["tensors"][k] = _list(state["inputs"][k].tensors)
            except _StepError as exc:
                reply, out_fds = {"ok": False, "kind": exc.kind, "error": exc.message, "stage": exc.stage}, []
            except _KeyError as exc:
                reply = {"ok": False, "kind": "runtime_error", "error": f"unknown input set {exc}",
                         "stage": "correctness"}
            except _BaseException as exc:  # noqa: BLE001 - SystemExit and the like from answer code too
                reply, out_fds = {"ok": False, "kind": _runtime_kind(exc), "error": _describe(exc),
                                  "stage": "load" if op == "load" else "correctness"}, []
            try:
                send(reply, out_fds)
            except _BaseException:
                _exit(0)
            finally:
                for fd in out_fds:
                    _close(fd)

    return serve
