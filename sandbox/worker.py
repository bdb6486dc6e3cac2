"""The outer process of one step: ``python -m sandbox.worker`` (a sandbox.wire.StepRequest on stdin).

Writes exactly one line on stdout: the result JSON (a SandboxResult dict plus internal keys), after
a tag that proves the line is this process's (sandbox.wire.result_line).

It applies limits and namespaces, forks the judge (sandbox/judge.py, which forks the runners in a
run step) and keeps the tail of everything they print (spam costs nothing). It alone holds the
step's result key, which it takes only after that fork, and it runs no answer code.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from sandbox import confine, isolation
from sandbox.gate import Gate
from sandbox.worker_status import describe_status
from sandbox.wire import KEY_BYTES, MAX_RESULT_BYTES, StepRequest, read_result_line, result_line, result_tag

__all__ = ["main", "read_result_line", "result_line", "result_tag"]


def _where(exc: BaseException) -> str:
    """" at FILE:LINE (FUNCTION)" of the judge's own innermost frame that raised ``exc``, first in
    the message (results cut long errors): a judge failure is the sandbox's bug, and its report
    must say where without a traceback (the log tail holds the answer's output, not ours)."""
    import traceback

    ours = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}sandbox{os.sep}" in f.filename]
    if not ours:
        return ""
    f = ours[-1]
    return f" at {os.path.basename(f.filename)}:{f.lineno} ({f.name})"


def main() -> int:
    req = StepRequest.from_json(sys.stdin.buffer.readline())
    t0 = time.monotonic()
    os.chdir(req.workdir)
    applied = ["own_session"] if os.getsid(0) == os.getpid() else []
    lim = req.limits
    applied += ["rlimit_" + n.removeprefix("rlimit_") for n in isolation.set_rlimits(
        lim.memory_bytes, lim.open_files, lim.processes, lim.cpu_s, lim.file_size_bytes)]
    iso = req.isolation
    # measures the pool's trusted GPU probe found to break the device (never a candidate's say)
    drop = set(iso.drop)
    namespaces = isolation.unshare_namespaces(network=iso.network and "netns" not in drop,
                                              pids=iso.pids and not drop & {"pidns", "mountns"},
                                              mounts=iso.pids and "mountns" not in drop,
                                              uts=iso.pids and "pidns" not in drop,
                                              ipc=iso.pids and "pidns" not in drop)
    applied += namespaces
    log_r, log_w = os.pipe()
    # A socket, not a pipe: where neither a PID namespace nor Landlock keeps the runners out of the
    # judge's /proc, one (or a process it left behind) could reopen a pipe through
    # /proc/<judge>/fd and wrap the judge's result in a verdict of its own. A socket cannot be
    # reopened that way.
    res_r, res_w = (s.detach() for s in socket.socketpair())
    conf_r, conf_w = os.pipe()  # the judge reports the measures it applied itself
    key_fd = req.key_fd
    pid = os.fork()
    if pid == 0:  # judge
        # First, before anything else: the judge and the runners it forks never hold the key, nor
        # its socket.
        if key_fd is not None:
            os.close(key_fd)
        os.close(log_r)
        os.close(res_r)
        os.close(conf_r)
        # Mounting must precede Landlock (a Landlock domain may not mount).
        # never a PID namespace with the host's /proc: its pid 1 would see every host process
        inner = isolation.mount_private_proc() if {"pidns", "mountns"} <= set(namespaces) else []
        if "mountns" in namespaces:
            inner += isolation.readonly_proc_sys()
            if iso.shm_bytes:
                inner += isolation.mount_private_shm(iso.shm_bytes, 4096)
            if req.mode in ("run", "compile"):  # what answer code writes there is bounded, gone with the step
                scratch = os.path.join(req.workdir, "scratch")
                os.makedirs(scratch, exist_ok=True)
                inner += isolation.mount_quota_dir(scratch, iso.dir_bytes, iso.dir_files) if iso.dir_bytes else []
            if req.mode == "run":  # a run step's writes to the shared build dir land in its scratch
                inner += isolation.mount_overlay(req.build_dir, os.path.join(req.workdir, "scratch", "build"))
        # a run step's runners add their own, narrower layer after the fork (sandbox/confine.py)
        inner += confine.confine_judge(req, scope=req.mode != "run")
        _write_all(conf_w, json.dumps(inner).encode())
        os.close(conf_w)
        # the pool's gate socket, kept by the judge alone to ask for the device (never a runner's)
        gate = Gate(req.gate_fd) if req.gated and req.gate_fd is not None else None
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_w, 1)
        os.dup2(log_w, 2)
        os.close(log_w)
        imports_from = time.monotonic()
        try:
            # the judge's imports pull in torch: in a fresh interpreter, most of what a cache-hit
            # step costs outside the answer's run (docs/sandbox.md, "Where a cache hit's time goes")
            from sandbox import judge

            imports_s = round(time.monotonic() - imports_from, 3)
            result = judge.harness(req, gate)
            if isinstance(result.get("wall_s"), dict):
                # t0 came with the fork: limits, namespaces, mounts and Landlock before the imports
                result["wall_s"].update(judge_imports=imports_s, judge_setup=round(imports_from - t0, 3))
        except BaseException as exc:  # noqa: BLE001 - the outer process must always get a verdict
            result = {"stage": "load", "error_kind": "sandbox_error", "error": f"judge failed{_where(exc)}: {exc!r}"}
        result["judge_end"] = time.monotonic()  # the outer process times the judge's exit from it
        _write_all(res_w, json.dumps(result).encode())
        os._exit(0)
    # Only now, in this process alone, the key. Read before the fork, it would be in the memory the
    # judge is forked with, and so in the memory of the runners it forks (a candidate can read its
    # own copy). This process runs no answer code and forks nothing else; its own memory is another
    # process's to read only with ptrace rights (Landlock, the PID namespace, seccomp and Yama's
    # ptrace_scope each deny the candidate those).
    key = _take_key(key_fd) if key_fd is not None else b""
    if req.gate_fd is not None:  # the judge's alone
        os.close(req.gate_fd)
    os.close(log_w)
    os.close(res_w)
    os.close(conf_w)
    with os.fdopen(conf_r, "rb") as f:
        inner_raw = f.read()
    applied += json.loads(inner_raw) if inner_raw else []
    tail, raw, status = _pump(log_r, res_r, pid, int(req.output_tail_bytes))
    exited = time.monotonic()
    result = _parse_result(raw, status)
    judge_end = result.pop("judge_end", None)
    if isinstance(judge_end, (int, float)):  # its processes' teardown: CUDA contexts freed (held window)
        result.setdefault("wall_s", {})["judge_exit"] = round(exited - judge_end, 3)
    candidate = result.pop("candidate_isolation", None)
    if candidate is not None:  # in a run step, what counts is the candidate runner's own layer
        applied = [m for m in applied if not m.startswith("landlock")]
        applied += candidate
    result["isolation"] = sorted(set(applied + result.get("isolation", [])))
    result.setdefault("wall_s", {})["worker_total"] = round(time.monotonic() - t0, 3)
    result["log_tail"] = tail.decode("utf-8", "replace")
    sys.stdout.buffer.write(result_line(result, key))
    sys.stdout.flush()
    return 0


def _take_key(fd: int) -> bytes:
    """The step's result key, which the pool wrote to a socket passed as ``key_fd`` (a socket, so
    that no other process can reopen it through /proc/<pid>/fd while the key waits in it)."""
    key = b""
    try:
        while len(key) < KEY_BYTES:
            chunk = os.read(fd, KEY_BYTES - len(key))
            if not chunk:
                break
            key += chunk
    finally:
        os.close(fd)
    return key


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _pump(log_fd: int, res_fd: int, pid: int, tail_bytes: int) -> tuple[bytes, bytes, int]:
    """Read the log (keeping its tail) and the result until the harness has exited.

    The judge's exit wakes the loop through a pidfd where the kernel has them (Linux 5.3): polling
    its status every 0.2 s added up to 0.2 s to every step, inside the GPU's held window (the
    judge's pipes close before its status can be read)."""
    tail, raw = bytearray(), bytearray()
    status: int | None = None
    fds = [log_fd, res_fd]
    try:
        exited = [os.pidfd_open(pid)]
    except (AttributeError, OSError):
        exited = []
    try:
        while True:
            ready, _, _ = select.select(fds + exited, [], [], 0.2)
            ready = [fd for fd in ready if fd in fds]
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    fds.remove(fd)
                elif fd == log_fd:
                    tail += chunk
                    del tail[:-tail_bytes]
                elif len(raw) < MAX_RESULT_BYTES:
                    raw += chunk
            if status is None:
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = st
            if status is not None and (not fds or not ready):
                # a leftover process may still hold the log pipe open: do not wait for it
                return bytes(tail), bytes(raw), status
    finally:
        for fd in exited:
            os.close(fd)


def _parse_result(raw: bytes, status: int) -> dict[str, Any]:
    if raw:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            pass
    how = describe_status(status)
    kind = "memory_limit" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL else "runtime_error"
    return {"stage": "load", "error_kind": kind, "error": f"the evaluation process {how} without a verdict"}


if __name__ == "__main__":
    sys.exit(main())
