"""Child process of one evaluation step: ``python -m sandbox.worker`` (JSON request on stdin).

Writes exactly one line on stdout: the result JSON (an EvalResult dict plus internal keys), after
a tag that proves the line is this process's (:func:`result_line`).

Three processes, so that no candidate code shares an address space with the verdict:

* outer (this module's ``main``): applies limits, namespaces and Landlock, then forks the harness
  and keeps the tail of everything the harness and the candidate print (spam costs nothing). It
  alone holds the step's result key, which it takes only after that fork.
* harness (PID 1 of its own PID namespace where allowed: when it exits, every process left in the
  namespace is killed): loads the task; in ``compile`` mode imports the candidate (``load_inline``
  builds into the content-addressed build dir); in ``run`` mode forks the candidate process, then,
  after the candidate has produced its outputs, computes the reference itself, compares, and
  times the reference. The reference never runs in a process the candidate has touched, so a
  candidate that patches torch, reads memory or replaces clocks cannot change the reference.
* candidate (``run`` mode): loads the cached build, runs the trials on its own copy of the inputs
  (same seeds), saves the outputs, and on the harness's word times itself with clocks captured
  before its code was imported.
"""
from __future__ import annotations

import hmac
import json
import math
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from sandbox import isolation

_MAX_RESULT_BYTES = 4 * 1024 * 1024
_KEY_BYTES = 32


def main() -> int:
    # one line: the pool keeps stdin open to answer a gated run step's wait for its device
    req = json.loads(sys.stdin.buffer.readline())
    t0 = time.monotonic()
    workdir = req["workdir"]
    os.chdir(workdir)
    applied = ["own_session"] if os.getsid(0) == os.getpid() else []
    lim = req["limits"]
    applied += ["rlimit_" + n.removeprefix("rlimit_") for n in isolation.set_rlimits(
        lim["memory_bytes"], lim["open_files"], lim["processes"], lim["cpu_s"], lim["file_size_bytes"])]
    iso = req["isolation"]
    # measures the pool's trusted GPU probe found to break the device (never a candidate's say)
    drop = set(iso.get("drop", ()))
    namespaces = isolation.unshare_namespaces(network=iso["network"] and "netns" not in drop,
                                              pids=iso["pids"] and not drop & {"pidns", "mountns"},
                                              mounts=iso["pids"] and "mountns" not in drop)
    applied += namespaces
    log_r, log_w = os.pipe()
    # A socket, not a pipe: where neither a PID namespace nor Landlock keeps the candidate out of the
    # harness's /proc, it (or a process it left behind) could reopen a pipe through
    # /proc/<harness>/fd and wrap the harness's result in a verdict of its own. A socket cannot be
    # reopened that way, and the candidate closes its inherited end before its code runs.
    res_r, res_w = (s.detach() for s in socket.socketpair())
    conf_r, conf_w = os.pipe()  # the harness reports the measures it applied itself
    key_fd = req.get("key_fd")
    pid = os.fork()
    if pid == 0:  # harness
        # First, before anything else: the harness (which imports the candidate in a compile step)
        # and the candidate process it forks in a run step never hold the key, nor its socket.
        if key_fd is not None:
            os.close(key_fd)
        os.close(log_r)
        os.close(res_r)
        os.close(conf_r)
        # Mounting must precede Landlock (a Landlock domain may not mount).
        # never a PID namespace with the host's /proc: its pid 1 would see every host process
        inner = isolation.mount_private_proc() if {"pidns", "mountns"} <= set(namespaces) else []
        # a run step's candidate adds its own, narrower layer after the fork (_candidate_process)
        inner += _confine(req, scope=req["mode"] != "run", proc_all=req["mode"] == "run")
        _write_all(conf_w, json.dumps(inner).encode())
        os.close(conf_w)
        # the pool's pipes, kept by the harness alone to ask for the device (never the candidate's)
        gate = _Gate(os.dup(0), os.dup(1)) if req.get("gated") else None
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_w, 1)
        os.dup2(log_w, 2)
        os.close(log_w)
        try:
            result = harness(req, res_w, gate)
        except BaseException as exc:  # noqa: BLE001 - the outer process must always get a verdict
            result = {"stage": "load", "error_kind": "sandbox_error", "error": f"harness failed: {exc!r}"}
        _write_all(res_w, json.dumps(result).encode())
        os._exit(0)
    # Only now, in this process alone, the key. Read before the fork, it would be in the memory the
    # harness is forked with, and so in the memory of the candidate the harness forks (a candidate
    # can read its own copy). This process runs no candidate code and forks nothing else; its own
    # memory is another process's to read only with ptrace rights (Landlock, the PID namespace and
    # Yama's ptrace_scope each deny the candidate those).
    key = _take_key(key_fd) if key_fd is not None else b""
    os.close(log_w)
    os.close(res_w)
    os.close(conf_w)
    with os.fdopen(conf_r, "rb") as f:
        inner_raw = f.read()
    applied += json.loads(inner_raw) if inner_raw else []
    tail, raw, status = _pump(log_r, res_r, pid, int(req.get("tail_bytes", 8192)))
    result = _parse_result(raw, status)
    candidate = result.pop("candidate_isolation", None)
    if candidate is not None:  # in a run step, the Landlock that counts is the candidate process's own
        applied = [m for m in applied if not m.startswith("landlock")]
        applied += [m for m in candidate if m.startswith("landlock")]
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
        while len(key) < _KEY_BYTES:
            chunk = os.read(fd, _KEY_BYTES - len(key))
            if not chunk:
                break
            key += chunk
    finally:
        os.close(fd)
    return key


def result_tag(key: bytes, body: bytes) -> bytes:
    """HMAC-SHA256 of ``body`` under ``key``, in hex: no space or newline in it."""
    return hmac.new(key, body, "sha256").hexdigest().encode()


def result_line(result: dict[str, Any], key: bytes) -> bytes:
    """``<tag> <json>\n``: the tag is an HMAC of the JSON under the step's key. Not the key itself:
    whoever can write to this process's stdout (a reopened /proc/<pid>/fd/1) can read it too, so a
    line that merely carried the key would hand it to the forger."""
    body = json.dumps(result).encode()
    return result_tag(key, body) + b" " + body + b"\n"


def read_result_line(line: bytes, key: bytes) -> dict[str, Any] | None:
    """The result of a line :func:`result_line` made with ``key``; None for any other line."""
    tag, sep, body = line.rstrip(b"\n").partition(b" ")
    if not sep or not hmac.compare_digest(tag, result_tag(key, body)):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _confine(req: dict[str, Any], scope: bool, proc_all: bool = False) -> list[str]:
    """Landlock for the calling process: writes only to its work and build dirs, /dev/shm, existing
    device files, and existing files beneath its own /proc/<pid>/task. The NVIDIA driver (570+)
    names the threads it starts by writing /proc/<pid>/task/<tid>/comm and fails cuInit with error
    304 when it cannot. A rule binds to one process's /proc inode, so in a run step the harness's
    layer allows writes beneath all of /proc (``proc_all``: it runs trusted code only) and the
    candidate, forked under it, adds a layer of its own with its own /proc/<pid>/task: a nested
    domain, so the harness can still read and kill whatever the candidate leaves behind, while the
    candidate (``scope``) can neither signal nor ptrace the harness."""
    iso = req["isolation"]
    drop = set(iso.get("drop", ()))
    if not iso["writes"] or "landlock" in drop:
        return []
    writable = [req["workdir"], req["build_dir"], "/dev/shm"]
    procfs = "/proc" if proc_all else f"/proc/{os.getpid()}/task"
    return isolation.restrict_writes(writable, ["/dev", procfs], block_tcp=iso["network"],
                                     scope=scope and "landlock_scope" not in drop)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _pump(log_fd: int, res_fd: int, pid: int, tail_bytes: int) -> tuple[bytes, bytes, int]:
    """Read the log (keeping its tail) and the result until the harness has exited."""
    tail, raw = bytearray(), bytearray()
    status: int | None = None
    fds = [log_fd, res_fd]
    while True:
        ready, _, _ = select.select(fds, [], [], 0.2)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                fds.remove(fd)
            elif fd == log_fd:
                tail += chunk
                del tail[:-tail_bytes]
            elif len(raw) < _MAX_RESULT_BYTES:
                raw += chunk
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
        if status is not None and (not fds or not ready):
            # a leftover process may still hold the log pipe open: do not wait for it
            return bytes(tail), bytes(raw), status


def _parse_result(raw: bytes, status: int) -> dict[str, Any]:
    if raw:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            pass
    how = describe_status(status)
    kind = "memory_limit" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL else "runtime_error"
    return {"stage": "load", "error_kind": kind, "error": f"the evaluation process {how} without a verdict"}


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"was killed by {name}"
    return f"exited with code {os.WEXITSTATUS(status)}"


# --- harness ------------------------------------------------------------------------------------

class _Gate:
    """A gated run step prepares (imports, task, isolation) before the pool gives it the device,
    then waits for the pool's word: its device is held only while candidate code can run."""

    def __init__(self, rfd: int, wfd: int):
        self.chan = _Channel(rfd, wfd)

    def wait(self) -> float:
        """Seconds spent waiting; the granted device becomes the only visible one."""
        t = time.monotonic()
        self.chan.send({"ready": True})
        grant = self.chan.recv(None)
        if grant.get("device") is not None:  # before CUDA starts: it reads this once, at init
            os.environ["CUDA_VISIBLE_DEVICES"] = str(grant["device"])
        self.close()
        return time.monotonic() - t

    def close(self) -> None:
        for fd in (self.chan.rfd, self.chan.wfd):
            try:
                os.close(fd)  # type: ignore[arg-type]
            except OSError:
                pass


def harness(req: dict[str, Any], res_fd: int, gate: _Gate | None = None) -> dict[str, Any]:
    if gate is not None and req["mode"] != "run":
        gate.close()
        gate = None
    if req["mode"] == "probe":
        return _probe_step(req["probe_src"])
    import torch

    from sandbox import protocol  # captures the clocks: before any candidate code

    torch.set_num_threads(int(req["cpu_threads"]))
    protocol.prepare_host_allocator()
    base = {"backend": req["backend"], "device": req["device"], "trials": int(req["trials"])}
    try:
        if req["mode"] == "compile":
            return {**base, **_compile_step(req)}
        return {**base, **_run_step(req, res_fd, gate)}
    except protocol.StepError as exc:
        return {**base, "stage": exc.stage, "error_kind": exc.kind, "error": exc.message}


def _probe_step(probe_src: str) -> dict[str, Any]:
    """The pool's own trusted code (never a candidate's): does the device work under this isolation?"""
    try:
        exec(compile(probe_src, "<isolation probe>", "exec"), {"__name__": "__isolation_probe__"})
    except BaseException as exc:  # noqa: BLE001 - any failure is the probe's answer
        return {"stage": "load", "error_kind": "runtime_error", "probe_ok": False,
                "error": f"{type(exc).__name__}: {exc}"[:2000]}
    return {"stage": "done", "probe_ok": True}


def _compile_step(req: dict[str, Any]) -> dict[str, Any]:
    from sandbox import build, protocol

    wanted: list[list[str]] = []
    build.install_build_hooks(req["build_dir"], req.get("pch_root"), wanted, req.get("narrow_header_dir"))
    t = time.perf_counter()
    try:
        protocol.build_candidate(req["candidate_src"], req["workdir"])
    except protocol.StepError as exc:
        return {"stage": exc.stage, "error_kind": exc.kind, "error": exc.message,
                "wall_s": {"compile": round(time.perf_counter() - t, 3)}}
    return {"stage": "compile", "compiled": True, "pch_wanted": wanted,
            "wall_s": {"compile": round(time.perf_counter() - t, 3)}}


def _memory_or_runtime(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text \
            or "outofmemory" in text or "cannot allocate memory" in text:
        return "memory_limit"
    return "runtime_error"


class _Channel:
    """Newline-delimited JSON over a pipe, with a deadline on reads."""

    def __init__(self, rfd: int | None = None, wfd: int | None = None):
        self.rfd, self.wfd, self.buf = rfd, wfd, b""

    def send(self, obj: Any) -> None:
        assert self.wfd is not None
        _write_all(self.wfd, (json.dumps(obj) + "\n").encode())

    def recv(self, deadline: float | None) -> Any:
        assert self.rfd is not None
        while b"\n" not in self.buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.rfd], [], [], left)
            if not ready:
                raise TimeoutError
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def _run_step(req: dict[str, Any], res_fd: int, gate: _Gate | None = None) -> dict[str, Any]:
    from sandbox import protocol

    workdir = Path(req["workdir"])
    task = protocol.load_task(req["task_src"], workdir)
    waited = gate.wait() if gate is not None else None
    to_harness_r, to_harness_w = os.pipe()
    to_cand_r, to_cand_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(res_fd)
        os.close(to_harness_r)
        os.close(to_cand_w)
        _candidate_process(req, task, _Channel(to_cand_r, to_harness_w), _confine(req, scope=True))
        os._exit(0)
    os.close(to_harness_w)
    os.close(to_cand_r)
    chan = _Channel(to_harness_r, to_cand_w)
    deadline = time.monotonic() + float(req["timeout_s"])
    result: dict[str, Any] = {"stage": "correctness", "compiled": False, "wall_s": {}}
    if waited is not None:
        result["wall_s"]["device_wait"] = round(waited, 3)
    try:
        # sent before any candidate code ran in that process, so the candidate cannot forge it
        reported = _await(chan, deadline, pid, "load").get("isolation", [])
        # a leftover of another step (no PID namespace) could still write here: names only, or none
        result["candidate_isolation"] = ([m for m in reported if isinstance(m, str)]
                                         if isinstance(reported, list) else [])
        # the reference outputs while the candidate computes its own: trusted work off the serial path
        t = time.perf_counter()
        references = _reference_outputs(req, task)
        result["wall_s"]["reference"] = round(time.perf_counter() - t, 3)
        msg = _await(chan, deadline, pid, "correctness")
        result["wall_s"].update(_reported_wall_s(msg, ("load", "correctness")))
        if not msg.get("ok"):
            stage = msg.get("stage")
            stage = stage if stage in _CANDIDATE_STAGES else "correctness"
            kind, error = _reported_failure(msg)
            result.update(stage=stage, error_kind=kind, error=error, compiled=stage not in ("load", "compile"))
            return result
        result["compiled"] = True
        verdict = _check(req, references, workdir / "candidate_outputs.pt")
        result["wall_s"]["check"] = verdict.pop("wall_s_check", 0.0)
        result.update(verdict)
        if not verdict["correct"] or not req["timed"]:
            chan.send("stop")
            result["stage"] = "done" if verdict["correct"] else "correctness"
            return result
        chan.send("time")
        result["stage"] = "timing"
        msg = _await(chan, deadline, pid, "timing")
        if not msg.get("ok"):
            kind, error = _reported_failure(msg)
            result.update(correct=False, error_kind=kind, error=error)
            return result
        times = msg.get("times")
        if not _plausible_times(times):
            # a forged message (the channel is the candidate's too): never a sandbox error
            raise _CandidateLost("runtime_error", "the candidate process sent malformed timings", "timing")
        result["wall_s"]["timing"] = _reported_wall_s(msg, ("timing",)).get("timing")
        new_ms = protocol.median_ms(times)
        _reap(pid)
        _kill_leftovers()
        ref_ms = req.get("ref_runtime_ms")
        if ref_ms is None:
            t = time.perf_counter()
            ref_ms = _time_reference(req, task)
            result["wall_s"]["ref_timing"] = round(time.perf_counter() - t, 3)
        speedup = ref_ms / new_ms if new_ms > 0 else float("inf")
        result.update(stage="done", timed=True, new_runtime_ms=new_ms, ref_runtime_ms=ref_ms,
                      speedup=speedup, flags=protocol.speedup_flags(speedup, float(req["excessive_speedup"])))
        return result
    except _CandidateLost as lost:
        result.update(correct=False, error_kind=lost.kind, error=lost.message, stage=lost.stage)
        return result
    finally:
        _kill(pid)


# What the candidate process reports a failure as (protocol.build_candidate, protocol.run_once,
# _memory_or_runtime), and the stages it reports one in: the channel is the candidate's too.
_CANDIDATE_KINDS = ("load_error", "compile_error", "runtime_error", "memory_limit", "wrong_output")
_CANDIDATE_STAGES = ("load", "compile", "correctness")


def _reported_failure(msg: dict[str, Any]) -> tuple[str, str]:
    """(kind, error) of a failure the candidate process reported. The channel is the candidate's
    too, so a message may be forged: a missing key or a kind the candidate process never reports
    (a sandbox or reference error, say) reads as a runtime error."""
    kind = msg.get("kind", "runtime_error")
    return (kind if kind in _CANDIDATE_KINDS else "runtime_error",
            str(msg.get("error", "the candidate process reported a failure")))


def _plausible_times(times: Any) -> bool:
    """Timings as the candidate process measures them: a non-empty list of finite, non-negative
    milliseconds with a positive median. Anything else was forged on the channel (a zero, negative
    or NaN median would read as an infinite speedup, which ``excessive_speedup: cap`` credits at
    the cap)."""
    if not isinstance(times, list) or not times:
        return False
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
               for x in times):
        return False
    return sorted(times)[len(times) // 2] > 0


def _reported_wall_s(msg: dict[str, Any], names: tuple[str, ...]) -> dict[str, float]:
    """The candidate's own phase times, ``names`` only and numbers only (a forged message must not
    overwrite the harness's times, nor make the harness fail as a sandbox error)."""
    wall = msg.get("wall_s")
    if not isinstance(wall, dict):
        return {}
    return {k: wall[k] for k in names if isinstance(wall.get(k), (int, float)) and not isinstance(wall[k], bool)}


class _CandidateLost(Exception):
    def __init__(self, kind: str, message: str, stage: str):
        super().__init__(message)
        self.kind, self.message, self.stage = kind, message, stage


def _await(chan: _Channel, deadline: float, pid: int, stage: str) -> dict[str, Any]:
    try:
        msg = chan.recv(deadline)
        if not isinstance(msg, dict):
            raise _CandidateLost("runtime_error", "the candidate process sent a malformed message", stage)
        return msg
    except TimeoutError:
        _kill(pid)
        raise _CandidateLost("timeout", f"the candidate ran past the run time limit during {stage}", stage) from None
    except (EOFError, json.JSONDecodeError, UnicodeDecodeError):
        status = _reap(pid)
        how = describe_status(status) if status is not None else "vanished"
        kind = "runtime_error"
        if status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU,):
            kind = "timeout"
        raise _CandidateLost(kind, f"the candidate process {how} during {stage}", stage) from None


def _reap(pid: int) -> int | None:
    try:
        _, status = os.waitpid(pid, 0)
        return status
    except ChildProcessError:
        return None


_PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread (no environment, never ours)
_UNSURE_ROUNDS = 10


def _kill_leftovers(rounds: int = 50) -> int:
    """Kill what the candidate left running before the reference is timed: a busy loop it forked
    off would slow the reference, inflating this speedup and the reference time the pool caches
    for every later evaluation of the task. In a PID namespace (this harness is pid 1) every other
    process is the candidate's; without one, those carrying this evaluation's marker variable."""
    me, parent = os.getpid(), os.getppid()
    own_proc = me == 1 and os.readlink("/proc/self") == "1"  # this namespace's /proc, not the host's
    needle = f"SANDBOX_EVAL_ID={os.environ.get('SANDBOX_EVAL_ID', '')}".encode()
    killed = 0
    for round_ in range(rounds):  # again until none is found: a leftover may fork while we scan
        found = unsure = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in (me, parent):
                continue
            pid = int(entry.name)
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[-1].split()
                if fields[0] == b"Z" or int(fields[6]) & _PF_KTHREAD:
                    continue  # already dead, waiting to be reaped; or a kernel thread
                if not own_proc:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        environ = f.read()
                    if not environ:  # in the middle of an exec (a leftover's grandchild, say): look again
                        unsure += 1
                        continue
                    if needle not in environ.split(b"\0"):
                        continue
                os.kill(pid, signal.SIGKILL)
                found += 1
            except (OSError, IndexError, ValueError):
                continue
        while True:  # reap the ones reparented to this pid 1
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        killed += found
        # a process with an empty environment may also just have one: a few rounds for those
        if not found and (not unsure or round_ >= _UNSURE_ROUNDS):
            break
        time.sleep(0.01)
    return killed


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _reference_outputs(req: dict[str, Any], task: Any) -> list[list[Any]]:
    """The reference's outputs for every trial's seeded inputs, computed in this clean process and
    kept where they were computed (on a GPU the comparison runs there: on the host it was most of a
    check, ~30 s on the H200)."""
    from sandbox import protocol

    device, seed = req["device"], int(req["seed"])
    try:
        ref_model = protocol.make_model(task.Model, task, seed, device)
    except Exception as exc:  # noqa: BLE001
        raise protocol.StepError("reference_error", f"Model(): {protocol.describe_exception(exc)}", "correctness")
    refs = []
    for i in range(int(req["trials"])):
        inputs = protocol.make_inputs(task, seed + 1 + i, device)
        try:
            refs.append(protocol.run_once(ref_model, inputs, device, "reference",
                                          to_host=not device.startswith("cuda")))
        except Exception as exc:  # noqa: BLE001
            raise protocol.StepError("reference_error", f"reference forward: {protocol.describe_exception(exc)}",
                                     "correctness")
        del inputs
    return refs


def _check(req: dict[str, Any], references: list[list[Any]], outputs_path: Path) -> dict[str, Any]:
    """Compare the candidate's saved outputs with the reference's, trial by trial."""
    import torch

    from sandbox import protocol

    t = time.perf_counter()
    try:
        outputs = protocol.load_outputs(outputs_path)
    except Exception as exc:  # noqa: BLE001 - the candidate process wrote (or failed to write) it
        return {"correct": False, "error_kind": "runtime_error",
                "error": f"candidate outputs unreadable: {protocol.describe_exception(exc, 300)}"}
    device, trials = req["device"], int(req["trials"])
    if not isinstance(outputs, list) or len(outputs) != trials:
        return {"correct": False, "error_kind": "runtime_error", "error": "candidate outputs incomplete"}
    worst_abs = worst_rel = 0.0
    for i, ref in enumerate(references):
        new = outputs[i]
        if not isinstance(new, list) or not all(isinstance(x, torch.Tensor) for x in new):
            return {"correct": False, "error_kind": "runtime_error", "error": "candidate outputs malformed"}
        if device.startswith("cuda"):
            new = [x.to(device) for x in new]
        bad, a, r = protocol.compare_with_errors(new, ref, req["tolerance"])
        if bad is not None:
            return {"correct": False, "error_kind": "wrong_output", "error": f"trial {i}: {bad.message}",
                    "which_output": bad.which_output, "max_abs_err": bad.max_abs_err,
                    "max_rel_err": bad.max_rel_err, "trials_passed": i,
                    "wall_s_check": round(time.perf_counter() - t, 3)}
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
    return {"correct": True, "trials_passed": trials, "max_abs_err": worst_abs, "max_rel_err": worst_rel,
            "wall_s_check": round(time.perf_counter() - t, 3)}


def _timing_inputs(req: dict[str, Any], task: Any) -> list[list[Any]]:
    from sandbox import protocol

    seed = int(req["seed"]) + 1000
    return [protocol.make_inputs(task, seed + k, req["device"]) for k in range(int(req["input_sets"]))]


def _time_reference(req: dict[str, Any], task: Any) -> float:
    from sandbox import protocol

    try:
        model = protocol.make_model(task.Model, task, int(req["seed"]), req["device"])
        times = protocol.time_model(model, _timing_inputs(req, task), req["device"], int(req["warmup"]),
                                    int(req["runs"]), int(req["flush_bytes"]))
    except Exception as exc:  # noqa: BLE001
        raise protocol.StepError("reference_error", f"reference timing: {protocol.describe_exception(exc)}", "timing")
    return protocol.median_ms(times)


# --- candidate process --------------------------------------------------------------------------

def _candidate_process(req: dict[str, Any], task: Any, chan: _Channel, confined: list[str]) -> None:
    import torch

    from sandbox import build, protocol

    chan.send({"isolation": confined})
    device, seed = req["device"], int(req["seed"])
    stage = "load"
    wall: dict[str, float] = {}
    try:
        build.install_build_hooks(req["build_dir"], req.get("pch_root"), [], req.get("narrow_header_dir"))
        t = time.perf_counter()
        module = protocol.build_candidate(req["candidate_src"], req["workdir"])
        wall["load"] = round(time.perf_counter() - t, 3)
        stage = "correctness"
        t = time.perf_counter()
        model = protocol.make_model(module.ModelNew, task, seed, device)
        outputs = []
        for i in range(int(req["trials"])):
            inputs = protocol.clone_inputs(protocol.make_inputs(task, seed + 1 + i, device))
            # outputs are usually about as large as the inputs: poison at least that much
            in_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
            protocol.poison_memory(max(int(req["poison_bytes"]), 2 * in_bytes), device)
            outputs.append(protocol.run_once(model, inputs, device, "candidate"))
        protocol.save_outputs(outputs, Path(req["workdir"]) / "candidate_outputs.pt")
        wall["correctness"] = round(time.perf_counter() - t, 3)
    except protocol.StepError as exc:
        _report_and_exit(chan, {"ok": False, "kind": exc.kind, "error": exc.message,
                                "stage": exc.stage if exc.stage != "correctness" else stage, "wall_s": wall})
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt from candidate code too
        _report_and_exit(chan, {"ok": False, "kind": _memory_or_runtime(exc), "stage": stage, "wall_s": wall,
                                "error": protocol.describe_exception(exc)})
    chan.send({"ok": True, "wall_s": wall})
    if chan.recv(None) != "time":
        os._exit(0)
    protocol.poison_host_allocations(False)  # the reference is timed without the fill, so the candidate is too
    try:
        t = time.perf_counter()
        times = protocol.time_model(model, _timing_inputs(req, task), device, int(req["warmup"]),
                                    int(req["runs"]), int(req["flush_bytes"]))
        chan.send({"ok": True, "times": times, "wall_s": {"timing": round(time.perf_counter() - t, 3)}})
    except BaseException as exc:  # noqa: BLE001
        _report_and_exit(chan, {"ok": False, "kind": _memory_or_runtime(exc), "stage": "timing",
                                "error": protocol.describe_exception(exc)})
    os._exit(0)


def _report_and_exit(chan: _Channel, msg: dict[str, Any]) -> None:
    try:
        chan.send(msg)
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
