"""The run step's input buffer sets (docs/sandbox.md, "One run step"): drawn on the step's device
from the task's ``get_inputs()``, shared with the runners once, redrawn in place from a new seed
before every call, and checked for changes the candidate made in place. A mixin of
sandbox.run_step.RunStep, whose ``req``, ``task``, ``ref``, ``deadline``, ``check_set`` and
``_spent`` it uses; apart so that each module reads as one part of the step."""
from __future__ import annotations

import os
import time
from typing import Any

from sandbox import checks, share
from sandbox.judge import Lost, Runner
from sandbox.wire import StepRequest, reported_failure

_perf_counter = time.perf_counter  # captured before any answer exists anywhere near this process


class InputSets:
    req: StepRequest
    task: Any
    ref: Runner
    deadline: float
    check_set: dict[str, Any]
    result: dict[str, Any]

    def _spent(self, part: str, since: float) -> None:
        """Add the seconds since ``since`` to ``wall_s["part_<part>"]``: where a held window goes."""
        wall = self.result["wall_s"]
        wall[f"part_{part}"] = round(wall.get(f"part_{part}", 0.0) + _perf_counter() - since, 4)

    def _make_set(self, k: int, runners: list[Runner]) -> dict[str, Any]:
        """One input buffer set, drawn on the device and shared with ``runners``."""
        from sandbox import protocol

        req = self.req
        try:
            values = protocol.make_inputs(self.task, int(req.seed) + 1, req.device)
        except Exception as exc:  # noqa: BLE001
            raise Lost("reference_error", f"get_inputs(): {protocol.describe_exception(exc)}", "correctness")
        keep, fds = [], []
        if req.device == "cpu":
            import torch

            bufs, descs = [], []
            for v in values:
                if isinstance(v, torch.Tensor):
                    buf, fd, m = share.shared_cpu_buffer(v)
                    keep.append(m)
                    fds.append(fd)
                    bufs.append(buf)
                    descs.append(share.input_descriptor(buf, len(fds) - 1))
                else:
                    bufs.append(v)
                    descs.append(share.export([v])[0][0])
        else:
            bufs = values
            descs, fds = share.export(bufs)
        regions = share.regions_of(descs, fds)
        for r in runners:
            msg, _ = r.ask("inputs", self.deadline, fds=fds, set=k, tensors=descs)
            if not msg["ok"]:
                kind, stage, error = reported_failure(msg, "correctness")
                raise Lost("reference_error" if r is self.ref else kind, f"{r.role} inputs: {error}", stage)
        for fd in fds:
            os.close(fd)
        return {"id": k, "values": bufs, "regions": regions, "keep": keep, "seed": None}

    def _fill(self, s: dict[str, Any], seed: int) -> None:
        """New values in the buffers of set ``s``, drawn from ``seed`` (outside any timed window)."""
        import torch

        from sandbox import protocol

        t = _perf_counter()
        fresh = protocol.make_inputs(self.task, seed, self.req.device)
        for i, (buf, v) in enumerate(zip(s["values"], fresh)):
            if isinstance(buf, torch.Tensor):
                if not isinstance(v, torch.Tensor) or v.shape != buf.shape or v.dtype != buf.dtype:
                    raise Lost("reference_error", f"get_inputs() input {i} changes shape or type between seeds",
                               "correctness")
                buf.copy_(v)
            elif buf != v:
                raise Lost("reference_error", f"get_inputs() input {i} changes value between seeds", "correctness")
        del fresh
        protocol.synchronize(self.req.device)
        s["seed"] = seed
        self._spent("fill", t)

    def _untouched(self, s: dict[str, Any], stage: str) -> None:
        """The candidate's inputs still equal the check set's fresh draw from their seed: nothing was
        changed in place."""
        import torch

        for i, (buf, p) in enumerate(zip(s["values"], self.check_set["values"])):
            if isinstance(buf, torch.Tensor) and not checks.same(buf, p):
                raise Lost("rule_violation", f"input {i} was modified in place by the candidate", stage,
                           ("input_modified",))
