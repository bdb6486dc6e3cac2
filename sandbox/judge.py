"""The judge: the trusted process of one step (PID 1 of the step's PID namespace where allowed).

In a run step (sandbox/run_step.py) it makes every input on the evaluation's device, owns the
clock, drives the two runners (sandbox/runner.py, through :class:`Runner` here) call by call,
checks inputs for tampering and outputs for aliasing, compares, and writes the verdict
(docs/sandbox.md, "The evaluation protocol"). It never runs
``Model`` or ``ModelNew`` code itself, so nothing an answer patches in its own process reaches
the judge's inputs, clocks, comparisons or verdict. In a compile step it imports the answer (so
``load_inline`` builds); in a probe step it runs the pool's own probe under a runner's confinement.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from sandbox import confine, share
from sandbox.gate import Gate
from sandbox.worker_status import describe_status
from sandbox.wire import Forged, StepRequest, check_reply

_perf_counter = time.perf_counter  # captured before any answer exists anywhere near this process


class Lost(Exception):
    """The step ends here with this verdict (a kind the runner or the judge established)."""

    def __init__(self, kind: str, message: str, stage: str, flags: tuple[str, ...] = ()):
        super().__init__(message)
        self.kind, self.message, self.stage, self.flags = kind, message, stage, list(flags)


def harness(req: StepRequest, gate: Gate | None) -> dict[str, Any]:
    if gate is not None and req.mode != "run":
        gate.close()
        gate = None
    if req.mode == "probe":
        return _probe_step(req)
    import torch

    from sandbox import protocol

    torch.set_num_threads(int(req.cpu_threads))
    protocol.prepare_host_allocator()
    base = {"backend": req.backend, "device": req.device, "trials": int(req.correctness_trials)}
    try:
        if req.mode == "compile":
            return {**base, **_compile_step(req)}
        from sandbox.run_step import RunStep

        return {**base, **RunStep(req, gate).run()}
    except protocol.StepError as exc:
        return {**base, "stage": exc.stage, "error_kind": exc.kind, "error": exc.message}


def _probe_step(req: StepRequest) -> dict[str, Any]:
    """The pool's own trusted code (never a candidate's): does the device work under a runner's
    confinement?"""
    applied = confine.confine_runner(req, req.workdir)
    try:
        exec(compile(req.probe_src, "<isolation probe>", "exec"), {"__name__": "__isolation_probe__"})
    except BaseException as exc:  # noqa: BLE001 - any failure is the probe's answer
        return {"stage": "load", "error_kind": "runtime_error", "probe_ok": False, "isolation": applied,
                "error": f"{type(exc).__name__}: {exc}"[:2000]}
    return {"stage": "done", "probe_ok": True, "isolation": applied}


def _compile_step(req: StepRequest) -> dict[str, Any]:
    from sandbox import build, protocol

    # the answer's code runs in this process: a runner's measures first (no capabilities, seccomp,
    # writes to its own /proc/<pid>/task only), on top of the judge's layer
    scratch = Path(req.workdir) / "scratch"  # a size-limited tmpfs where one could be mounted
    workdir = str(scratch) if scratch.is_dir() else req.workdir
    os.chdir(workdir)
    os.environ.update(HOME=workdir, TMPDIR=workdir)
    applied = confine.confine_runner(req, workdir)
    wanted: list[list[str]] = []
    split_wanted: list[list[str]] = []
    build.install_build_hooks(req.build_dir, req.pch_root, wanted, req.narrow_header_dir, req.split_root, split_wanted)
    t = time.perf_counter()
    try:
        protocol.build_candidate(req.candidate_src, workdir)
    except protocol.StepError as exc:
        return {"stage": exc.stage, "error_kind": exc.kind, "error": exc.message, "isolation": applied,
                "wall_s": {"compile": round(time.perf_counter() - t, 3)}}
    return {"stage": "compile", "compiled": True, "pch_wanted": wanted, "split_wanted": split_wanted, "isolation": applied,
            "wall_s": {"compile": round(time.perf_counter() - t, 3)}}


class Runner:
    """The judge's end of one runner process."""

    def __init__(self, role: str, pid: int, sock: socket.socket):
        self.role, self.pid, self.chan = role, pid, share.Channel(sock)
        self.forged = 0

    @classmethod
    def fork(cls, role: str, req: StepRequest, task: Any) -> "Runner":
        from sandbox import runner

        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            try:
                # nothing of the judge's but the channel: not its result socket, not the pool's pipes
                keep = theirs.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, 1 << 16)
                # inside the step's quota where it could be mounted (sandbox/worker.py)
                scratch = Path(req.workdir) / "scratch"
                workdir = str((scratch if scratch.is_dir() else Path(req.workdir)) / role)
                os.makedirs(workdir, exist_ok=True)
                os.chdir(workdir)
                os.environ.update(HOME=workdir, TMPDIR=workdir)  # the only place it may write
                applied = confine.confine_runner(req, workdir)
                runner.run(role, req, task, theirs, applied)
            finally:
                os._exit(0)
        theirs.close()
        return cls(role, pid, ours)

    def ask(self, op: str, deadline: float, fds: list[int] = (), **payload: Any) -> tuple[dict[str, Any], list[int]]:  # type: ignore[assignment]
        """Send ``op`` and wait for its one reply. A message already waiting before it was asked
        for is forged (a reply written ahead of the call would read as an instant answer)."""
        self._refuse_unasked()
        self.chan.send({"op": op, **payload}, list(fds))
        return self.reply(op, deadline)

    def reply(self, op: str, deadline: float) -> tuple[dict[str, Any], list[int]]:
        stage = "load" if op in ("ready", "load") else "correctness"
        try:
            msg, fds = self.chan.recv(deadline)
        except TimeoutError:
            self.kill()
            raise Lost("timeout", f"the {self.role} ran past the run time limit ({op})", stage) from None
        except (EOFError, OSError):
            status = self.reap()
            hint = ""
            if status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == 11 and op == "call":
                hint = "; note: the inputs it is given are read-only, and writing one in place faults"
            raise Lost("runtime_error", f"the {self.role} process {describe_status(status)} ({op}){hint}",
                       stage) from None
        except Forged as exc:
            raise Lost("rule_violation", f"the {self.role} sent a forged message: {exc}", stage,
                       ("forged_message",)) from None
        try:
            return check_reply(msg, op), fds
        except Forged as exc:
            share._close_all(fds)
            raise Lost("rule_violation", f"the {self.role} sent a forged message: {exc}", stage,
                       ("forged_message",)) from None

    def _refuse_unasked(self) -> None:
        import select

        ready, _, _ = select.select([self.chan.sock], [], [], 0)
        if ready:
            raise Lost("rule_violation", f"the {self.role} sent a message nobody asked for", "timing",
                       ("forged_message",))

    def kill(self) -> None:
        """SIGKILL and reap: once this returns the process, and its CUDA context, are gone."""
        self.signal_kill()
        self.reap()

    def signal_kill(self) -> None:
        """SIGKILL without waiting for the process to end (``kill`` reaps it)."""
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass

    def reap(self) -> int | None:
        try:
            return os.waitpid(self.pid, 0)[1]
        except ChildProcessError:
            return None
