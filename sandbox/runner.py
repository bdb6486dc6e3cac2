"""A runner: the process that holds one model (the task's ``Model`` or the answer's ``ModelNew``)
and runs it on the judge's inputs when the judge says so (sandbox/judge.py forks two).

It measures nothing and decides nothing: it answers ``load``, ``inputs``, ``prep`` and ``call`` with
the replies of sandbox.wire (``prep`` and ``call`` through sandbox/call_path.py, bound before the
answer is imported), and a ``call``'s answer is the descriptors of its outputs (shared, never
copied through a file), sent after a device-wide synchronise. The candidate runner's code is the
answer's to change once the answer is imported, which is why the judge believes none of it beyond
what it can check.
"""
from __future__ import annotations

import functools
import os
import socket
from typing import Any

from sandbox import call_path, share
from sandbox.wire import StepRequest


def run(role: str, req: StepRequest, task: Any, sock: socket.socket, confined: list[str]) -> None:
    """The runner's loop; never returns (``os._exit``)."""
    chan = share.Channel(sock)
    if req.starts_cuda_early():
        # the GPU this step was given: CUDA starts here while the step waits for its turn (trusted
        # code still: the answer is imported only once the step holds the GPU)
        from sandbox import protocol

        protocol.start_cuda(req.device)
    # Everything a call runs on this side is bound here, before the answer is imported (it is
    # imported by the first ``load``): the device-wide synchronise that ends every call (red team
    # A33 rebound sandbox.protocol.synchronize) and the rest of the call path (A34 rebound the
    # seeding, poison, sealing and aliasing helpers from C++). sandbox/call_path.py says what is
    # left open.
    serve = call_path.bind(sock, role, req.device, _device_fence(req.device),
                           functools.partial(_handle, role, req, task))
    chan.send({"ready": True, "isolation": confined})
    serve({"inputs": {}, "held": [], "model": None})
    os._exit(0)


def _device_fence(device: str) -> Any:
    """A callable that waits for every stream of this process's device (the C function itself, not a
    name looked up at call time); a no-op on the CPU."""
    if not device.startswith("cuda"):
        return lambda: None
    import torch

    return getattr(torch._C, "_cuda_synchronize", None) or torch.cuda.synchronize


def _handle(role: str, req: StepRequest, task: Any, op: str, msg: dict[str, Any], fds: list[int],
            state: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    import torch

    from sandbox import protocol

    if op == "load":
        device = msg.get("device")
        if req.device.startswith("cuda") and device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(device)  # before CUDA starts: read once, at init
        if role == "candidate":
            from sandbox import build

            build.install_build_hooks(req.build_dir, req.pch_root, [], req.narrow_header_dir, req.split_root)
            try:
                module = protocol.build_candidate(req.candidate_src, os.getcwd())
            except protocol.StepError as exc:
                return {"ok": False, "kind": exc.kind, "error": exc.message, "stage": exc.stage}, []
            cls = module.ModelNew
        else:
            cls = task.Model
        if req.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        state["model"] = protocol.make_model(cls, task, req.seed, req.device)
        return {"ok": True}, []
    if op == "warm":  # the gate's word that this step is among the next admitted: CUDA starts now
        if state["model"] is None:  # trusted code: no answer imported yet
            protocol.start_cuda(req.device)
        return {"ok": True}, []
    if op == "inputs":
        opened = share.import_all(msg.get("tensors"), fds, req.device, require_sealed=False)
        state["inputs"][int(msg.get("set", 0))] = opened
        return {"ok": True}, []
    return {"ok": False, "kind": "runtime_error", "error": f"unknown op {op!r}", "stage": "correctness"}, []

