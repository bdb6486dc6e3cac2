"""A runner: the process that holds one model (the task's ``Model`` or the answer's ``ModelNew``)
and runs it on the judge's inputs when the judge says so (sandbox/judge.py forks two).

It measures nothing and decides nothing: it answers ``load``, ``inputs`` and ``call`` with the
replies of sandbox.wire, and a ``call``'s answer is the descriptors of its outputs (shared, never
copied through a file), sent after a device-wide synchronise. The candidate runner's code is the
answer's to change once the answer is imported, which is why the judge believes none of it beyond
what it can check.
"""
from __future__ import annotations

import os
import socket
from typing import Any

from sandbox import share
from sandbox.wire import StepRequest


def run(role: str, req: StepRequest, task: Any, sock: socket.socket, confined: list[str]) -> None:
    """The runner's loop; never returns (``os._exit``)."""
    chan = share.Channel(sock)
    if req.starts_cuda_early():
        # the GPU this step was given: CUDA starts here while the step waits for its turn (trusted
        # code still: the answer is imported only once the step holds the GPU)
        from sandbox import protocol

        protocol.start_cuda(req.device)
    # The device-wide synchronise that ends every call, held here as a local of this frame before the
    # answer is imported: an answer that rebinds sandbox.protocol.synchronize or torch.cuda.synchronize
    # (red team A33: its reply came before its queued GPU work ended, and the judge's clock missed the
    # work) cannot reach it; only rewriting this process's own reply code (a code object, a frame's
    # locals through ctypes) could, and docs/sandbox.md lists that as open.
    fence = _device_fence(req.device)
    chan.send({"ready": True, "isolation": confined})
    state: dict[str, Any] = {"inputs": {}, "held": [], "model": None}
    while True:
        try:
            msg, fds = chan.recv(None)
        except (EOFError, OSError, share.Forged):
            os._exit(0)
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "stop" or op is None:
            os._exit(0)
        from sandbox import protocol

        try:
            reply, out_fds = _handle(role, req, task, op, msg, fds, state)
            if op == "call":
                try:
                    fence()
                except BaseException:
                    for fd in out_fds:
                        os.close(fd)
                    raise
        except protocol.StepError as exc:
            reply, out_fds = {"ok": False, "kind": exc.kind, "error": exc.message, "stage": exc.stage}, []
        except BaseException as exc:  # noqa: BLE001 - SystemExit and the like from answer code too
            reply, out_fds = {"ok": False, "kind": protocol.memory_or_runtime(exc), "error":
                              protocol.describe_exception(exc), "stage": _stage(op)}, []
        try:
            chan.send(reply, out_fds)
        finally:
            for fd in out_fds:
                os.close(fd)


def _device_fence(device: str) -> Any:
    """A callable that waits for every stream of this process's device (the C function itself, not a
    name looked up at call time); a no-op on the CPU."""
    if not device.startswith("cuda"):
        return lambda: None
    import torch

    return getattr(torch._C, "_cuda_synchronize", None) or torch.cuda.synchronize


def _stage(op: str) -> str:
    return {"load": "load", "inputs": "correctness"}.get(op, "correctness")


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

            build.install_build_hooks(req.build_dir, req.pch_root, [], req.narrow_header_dir)
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
    if op == "ping":  # the judge's measure of a bare round trip (no forward, no outputs)
        return {"ok": True}, []
    if op == "warm":  # the gate's word that this step is among the next admitted: CUDA starts now
        if state["model"] is None:  # trusted code: no answer imported yet
            protocol.start_cuda(req.device)
        return {"ok": True}, []
    if op == "inputs":
        opened = share.import_all(msg.get("tensors"), fds, req.device, require_sealed=False)
        state["inputs"][int(msg.get("set", 0))] = opened
        return {"ok": True}, []
    if op == "call":
        inputs = state["inputs"][int(msg.get("set", 0))].tensors
        poison = int(msg.get("poison", 0))
        state["held"] = []  # the previous call's outputs: the judge is done with them
        if poison:
            protocol.poison_memory(poison, req.device)
        protocol.poison_host_allocations(bool(poison))
        if isinstance(msg.get("rng"), int):
            protocol.seed_everything(msg["rng"])
        with torch.no_grad():
            out = state["model"](*inputs)
            protocol.synchronize(req.device)
        outs = protocol.outputs_as_list(out, role)
        state["held"] = outs
        alias = _aliasing(outs, inputs)
        if alias:  # said plainly here (the judge sees it too): torch would refuse to share it anyway
            return {"ok": False, "kind": "rule_violation", "flag": alias[0], "error": alias[1],
                    "stage": "correctness"}, []
        descs, out_fds = share.export(outs)
        protocol.synchronize(req.device)
        reply: dict[str, Any] = {"ok": True, "outputs": descs}
        if role == "reference" and req.device.startswith("cuda"):
            reply["peak_bytes"] = int(torch.cuda.max_memory_allocated())
        return reply, out_fds
    return {"ok": False, "kind": "runtime_error", "error": f"unknown op {op!r}", "stage": "correctness"}, []


def _aliasing(outs: list[Any], inputs: list[Any]) -> tuple[str, str] | None:
    """(flag, message) when an output shares memory with an input or with another output."""
    import torch

    def span(t: torch.Tensor) -> tuple[int, int]:
        start = t.untyped_storage().data_ptr()
        return start, start + t.untyped_storage().nbytes()

    ins = [span(x) for x in inputs if isinstance(x, torch.Tensor) and x.numel()]
    seen: list[tuple[int, int]] = []
    for i, t in enumerate(outs):
        if not t.numel():
            continue
        a = span(t)
        if any(a[0] < b[1] and b[0] < a[1] for b in ins):
            return "output_aliases_input", f"output {i} shares memory with an input: outputs must be new tensors"
        if any(a[0] < b[1] and b[0] < a[1] for b in seen):
            return "output_aliases_output", f"output {i} shares memory with another output"
        seen.append(a)
    return None
