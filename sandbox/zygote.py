"""A pre-imported worker (a zygote) that forks one worker process per host run step.

A fresh worker (``python -m sandbox.worker``) spends two thirds of a cache-hit step importing torch
(docs/sandbox.md, "Where a cache hit's time goes"). The pool starts one zygote per distinct start
environment (``python -m sandbox.zygote``, the environment a step's worker would get less the
per-step values in ``PER_STEP_ENV``); it imports what every run step imports, checks that it is
still one thread with no CUDA context, and from then on only forks. Each child becomes exactly the
process a fresh worker is once its imports are done: its own session, the step's stdin, stdout and
stderr pipes, its key and gate sockets at the numbers the request names and no other descriptor,
the step's environment (and its marker where /proc/<pid>/environ shows it, for the pool's sweep),
the step's work dir as cwd and ``sys.path[0]``; then ``sandbox.worker.main`` applies the limits,
namespaces, Landlock, privileges and seccomp as it does in a fresh worker, before any answer code.

What keeps steps apart: the zygote never runs answer code and never reads a key (it holds each
step's key socket only between receiving it and the fork); a child never returns to it, and every
child is forked from the same post-import state, so nothing one step does reaches the next. What the
zygote's memory holds of earlier steps is their environment (paths, markers), never a secret.

Host steps use it (cpu, and triton through its interpreter); GPU run steps too where
``zygote_gpu_steps`` is on: a GPU step's processes start CUDA themselves, which is sound in a child
of a process that never *started* the CUDA driver. Loading libcuda is not starting it (torch 2.11
maps it at import on the H100 machine): the driver's state (its threads, the device files
/dev/nvidia*, their memory mappings) comes from ``cuInit``, and that is what a child must not
inherit. The zygote reports whether it has a /dev/nvidia* file open or mapped (and that it is still
one thread, checked before every fork); a zygote that has serves no GPU step. Compile and probe
steps keep a fresh worker.

Hand-written, not ``multiprocessing``'s forkserver: that one unpickles what its client sends and
runs a Python target with its own descriptor and resource-tracker conventions, while a child here
needs its descriptors at fixed numbers, a new session and the marker in its environment block, and
the pool needs a pidfd of it (the zygote, not the pool, is its parent).
"""
from __future__ import annotations

import asyncio
import ctypes
import fcntl
import json
import logging
import os
import select
import socket
import sys
import threading
import traceback
from typing import Any

from sandbox.wire import MARKER, MAX_LINE_BYTES

PER_STEP_ENV = ("HOME", "TMPDIR", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "CUDA_VISIBLE_DEVICES", MARKER)
MARK_ROOM = 128          # bytes reserved for a step's marker in the zygote's environment block
ZYGOTE_MARK = "zygote".ljust(MARK_ROOM, ".")
MAX_MESSAGE = 1 << 20
log = logging.getLogger("sandbox.pool")


def preload() -> None:
    """What a run step imports before its answer (the judge, its run step, the runners, torch)."""
    import statistics  # noqa: F401  (run_step imports it per step)

    import torch  # noqa: F401

    from sandbox import compare, footprint, judge, protocol, run_step, runner, worker  # noqa: F401


def fork_safe() -> str | None:
    """Why forking this process now would be unsafe, or None. Checked after the imports and again
    before every fork (well under a millisecond)."""
    import torch

    threads = len(os.listdir("/proc/self/task"))
    if threads != 1 or threading.active_count() != 1:
        return f"{threads} threads after the imports ({threading.active_count()} Python threads)"
    if torch.cuda.is_initialized():
        return "CUDA was initialised by the imports"
    return None


def driver_loaded() -> bool:
    """Whether the CUDA driver library is mapped here (a diagnostic for benches and tests, not a
    reason to refuse a GPU fork: see :func:`driver_started`)."""
    with open("/proc/self/maps") as maps:
        return any("libcuda.so" in line for line in maps)


def driver_started(device_prefix: str = "/dev/nvidia") -> bool:
    """Whether this process has started the GPU driver: one of its device files open or mapped
    (``cuInit`` opens /dev/nvidiactl and /dev/nvidia<N> and maps them; loading libcuda does
    neither). A child that starts CUDA must come from a process where this is False (the pool
    forks GPU steps only from a zygote that reported so)."""
    fd_dir = "/proc/self/fd"
    for name in os.listdir(fd_dir):
        try:
            if os.readlink(os.path.join(fd_dir, name)).startswith(device_prefix):
                return True
        except OSError:   # the listing's own descriptor, closed by now
            continue
    with open("/proc/self/maps") as maps:
        return any(device_prefix in line for line in maps)


def serve(ctl: socket.socket) -> int:
    """The zygote's loop: a ``spawn`` message (JSON plus the child's descriptors) forks a child and
    answers its pid and a pidfd of it; each child's exit is reported with its wait status."""
    preload()
    problem = fork_safe()
    if problem:
        _send(ctl, {"error": f"the zygote cannot fork safely: {problem}"})
        return 1
    _send(ctl, {"ready": os.getpid(), "driver": driver_started()})
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        ready, _, _ = select.select([ctl.fileno(), *children], [], [])
        for fd in ready:
            if fd != ctl.fileno():
                pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                _send(ctl, {"exit": pid, "status": status})
                continue
            data, fds, _flags, _addr = socket.recv_fds(ctl, MAX_MESSAGE, 8)
            if not data:  # the pool is gone: nothing more to serve (children live on in their sessions)
                return 0
            msg = json.loads(data)
            problem = fork_safe()
            if problem:
                _send(ctl, {"error": f"the zygote cannot fork safely any more: {problem}"})
                return 1
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 70
                try:
                    code = _become_worker(ctl, msg, fds)
                except BaseException:  # noqa: BLE001 - the step's stderr tail says why; the pool sees it lost
                    traceback.print_exc()
                finally:
                    sys.stderr.flush()
                    os._exit(code)
            for passed in fds:
                os.close(passed)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = pid
            _send(ctl, {"id": msg["id"], "pid": pid}, [pidfd])


def _become_worker(ctl: socket.socket, msg: dict[str, Any], fds: list[int]) -> int:
    """In the child: what ``python -m sandbox.worker`` started by the pool would be, then its main."""
    import random
    import tempfile

    ctl.detach()  # its descriptor is closed below with the rest; the object must not close a reused number
    os.setsid()
    targets = [int(t) for t in msg["fds"]]
    if len(targets) != len(fds):
        raise ValueError(f"spawn message: {len(fds)} descriptors for targets {targets}")
    above = max(targets) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in fds]  # out of the way of every target
    for src, dst in zip(moved, targets):
        os.dup2(src, dst)
    last = 0
    for keep in sorted(set(targets)) + [os.sysconf("SC_OPEN_MAX")]:
        if keep > last:  # (an empty range would close everything: closerange(0, 0) is close_range(0, ~0))
            os.closerange(last, keep)  # everything else: the control socket, pidfds, the moved copies
        last = keep + 1
    env = msg["env"]
    mark_environment_block(env[MARKER])
    os.environ.clear()
    os.environ.update(env)
    started_in = os.getcwd()
    os.chdir(msg["cwd"])
    if sys.path and sys.path[0] == started_in:
        sys.path[0] = os.getcwd()  # `python -m` puts its cwd first: the work dir, as a fresh worker's read roots
    tempfile.tempdir = None   # computed again from this step's TMPDIR
    random.seed()             # a fresh interpreter's state, not the zygote's
    from sandbox import worker

    sys.argv = [worker.__file__]
    return worker.main()


def mark_environment_block(marker: str) -> None:
    """Write ``MARKER=marker`` over the zygote's placeholder in the environment block the kernel
    shows as /proc/<pid>/environ (``putenv`` changes only the C array, which /proc does not show),
    so that the pool's and the judge's sweeps (sandbox/sweep.py) find this step's processes."""
    value = marker.encode()
    if len(value) > MARK_ROOM:
        raise ValueError(f"marker {marker!r} longer than the zygote's room ({MARK_ROOM} bytes)")
    prefix = f"{MARKER}=".encode()
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    i = 0
    while environ[i]:
        addr = environ[i]
        if ctypes.string_at(addr, len(prefix)) == prefix and len(ctypes.string_at(addr)) == len(prefix) + MARK_ROOM:
            ctypes.memmove(addr + len(prefix), value.ljust(MARK_ROOM, b"\0"), MARK_ROOM)
            break
        i += 1
    with open("/proc/self/environ", "rb") as f:
        if prefix + value not in f.read().split(b"\0"):
            raise RuntimeError(f"{MARKER} placeholder not found in this process's environment block")


def _send(ctl: socket.socket, obj: dict[str, Any], fds: list[int] | None = None) -> None:
    socket.send_fds(ctl, [json.dumps(obj).encode()], fds or [])


# --- the pool's side ---------------------------------------------------------------------------

class ZygoteGone(Exception):
    """A zygote could not start, or could not fork a step (the step then gets a fresh worker).
    ``final``: it refused to serve this environment (not fork-safe there), so none is started again."""

    def __init__(self, why: str, final: bool = False):
        super().__init__(why)
        self.final = final


class ForkedWorker:
    """A worker forked by a zygote: the part of ``asyncio.subprocess.Process`` that sandbox.launch
    uses (pid, the three pipes, ``wait``, ``returncode``). Its parent is the zygote, so it is waited
    for through a pidfd, and its exit status is the zygote's report (None if the zygote died first)."""

    def __init__(self, pid: int, pidfd: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader, status: asyncio.Future, transports: list[asyncio.BaseTransport]):
        self.pid, self.stdin, self.stdout, self.stderr = pid, stdin, stdout, stderr
        self.returncode: int | None = None
        self._pidfd, self._status, self._transports = pidfd, status, transports
        self._transport = self  # what sandbox.launch.release_transport closes, as on asyncio's Process

    async def wait(self) -> int | None:
        loop = asyncio.get_running_loop()
        gone: asyncio.Future = loop.create_future()
        loop.add_reader(self._pidfd, lambda: gone.done() or gone.set_result(None))
        try:
            await gone
        finally:
            loop.remove_reader(self._pidfd)
        try:
            status = await asyncio.wait_for(asyncio.shield(self._status), 2.0)
        except asyncio.TimeoutError:
            status = None
        if status is not None:
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def close(self) -> None:
        for t in self._transports:
            t.close()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class Zygote:
    """The pool's handle on one zygote process and its control socket (SOCK_SEQPACKET: one message
    per packet, descriptors attached)."""

    def __init__(self, env: dict[str, str], cwd: str):
        self.env, self.cwd = env, cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.ctl: socket.socket | None = None
        self.alive = False
        self.driver = True   # whether it has started the GPU driver (its ready message says): no GPU steps then
        self._ready: asyncio.Future | None = None
        self._spawns: dict[int, asyncio.Future] = {}
        self._exits: dict[int, asyncio.Future] = {}
        self._next = 0

    async def start(self, timeout_s: float = 300.0) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # its own errors, and a child's before its stderr is the step's, go to a file only the pool reads
        errors = open(os.path.join(self.cwd, "stderr.log"), "ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sandbox.zygote", str(theirs.fileno()), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=errors, cwd=self.cwd, env=self.env,
                start_new_session=True, pass_fds=(theirs.fileno(),))
        except OSError as exc:
            ours.close()
            raise ZygoteGone(f"could not start the zygote: {exc}") from exc
        finally:
            theirs.close()
            errors.close()
        ours.setblocking(False)
        self.ctl, self.alive = ours, True
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_message)
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)
        except asyncio.TimeoutError as exc:
            self._ready.cancel()
            raise ZygoteGone(f"the zygote was not ready within {timeout_s:g} s") from exc

    async def spawn(self, env: dict[str, str], cwd: str, passed: list[int]) -> ForkedWorker:
        """A child for one step: ``env`` (with its marker), ``cwd``, and ``passed`` (the key and gate
        sockets) at the same descriptor numbers as here, since the request names them."""
        if not self.alive or self.ctl is None:
            raise ZygoteGone("the zygote is gone")
        loop = asyncio.get_running_loop()
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        self._next += 1
        ident = self._next
        answer: asyncio.Future = loop.create_future()
        self._spawns[ident] = answer
        msg = {"id": ident, "env": env, "cwd": cwd, "fds": [0, 1, 2, *passed]}
        try:
            socket.send_fds(self.ctl, [json.dumps(msg).encode()], [in_r, out_w, err_w, *passed])
            pid, pidfd = await asyncio.wait_for(answer, 30.0)
        except (OSError, asyncio.TimeoutError, ZygoteGone) as exc:
            self._spawns.pop(ident, None)
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            raise ZygoteGone(f"the zygote did not fork the step: {exc!r}") from exc
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)  # the child has its own copies
        stdout, stderr = asyncio.StreamReader(limit=MAX_LINE_BYTES), asyncio.StreamReader()
        t_out, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout), open(out_r, "rb", 0))
        t_err, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr), open(err_r, "rb", 0))
        t_in, p_in = await loop.connect_write_pipe(lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()),
                                                   open(in_w, "wb", 0))
        stdin = asyncio.StreamWriter(t_in, p_in, None, loop)  # type: ignore[arg-type]
        return ForkedWorker(pid, pidfd, stdin, stdout, stderr, self._exits[pid], [t_in, t_out, t_err])

    def _on_message(self) -> None:
        assert self.ctl is not None
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.ctl, MAX_MESSAGE, 2)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        if not data:
            self._lost("the zygote closed its control socket")
            return
        msg = json.loads(data)
        if "ready" in msg and self._ready is not None and not self._ready.done():
            self.driver = bool(msg.get("driver", True))
            self._ready.set_result(msg["ready"])
        elif "error" in msg:
            self._lost(str(msg["error"]), final=True)
        elif "pid" in msg and fds:
            self._exits[msg["pid"]] = asyncio.get_running_loop().create_future()
            answer = self._spawns.pop(msg["id"], None)
            if answer is not None and not answer.done():
                answer.set_result((msg["pid"], fds[0]))
            else:
                os.close(fds[0])
        elif "exit" in msg:
            done = self._exits.pop(msg["exit"], None)
            if done is not None and not done.done():
                done.set_result(msg["status"])

    def _lost(self, why: str, final: bool = False) -> None:
        self.alive = False
        if self.ctl is not None:
            asyncio.get_running_loop().remove_reader(self.ctl.fileno())
        for fut in [self._ready, *self._spawns.values()]:
            if fut is not None and not fut.done():
                fut.set_exception(ZygoteGone(why, final))
        for fut in self._exits.values():
            if not fut.done():
                fut.set_result(None)  # exited or not, nobody reports its status now

    def close(self) -> None:
        """Stop the zygote (its children are in their own sessions and are the pool's to kill)."""
        if self.alive:
            self._lost("closed by the pool")
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.proc is not None:
            if self.proc.returncode is None:
                try:
                    self.proc.kill()
                except ProcessLookupError:
                    pass
            transport = getattr(self.proc, "_transport", None)
            if transport is not None:
                transport.close()


class Zygotes:
    """The pool's zygotes, one per start environment; one found dead is started again for the next
    step, and a step it cannot fork gets a fresh worker (``fork`` returns None)."""

    MAX_FAILED_STARTS = 3   # in a row, per environment: then that environment gets fresh workers only

    def __init__(self, cwd: str):
        self.cwd = cwd
        self.by_env: dict[tuple[tuple[str, str], ...], Zygote] = {}
        self.failed_starts: dict[tuple[tuple[str, str], ...], int] = {}
        self.starts = 0
        self.warned_driver: set[tuple[tuple[str, str], ...]] = set()
        self._lock = asyncio.Lock()

    async def fork(self, env: dict[str, str], cwd: str, passed: list[int], gpu: bool = False) -> ForkedWorker | None:
        """A child of the zygote of ``env``'s start environment (started on first use), or None: the
        step then starts a fresh worker. ``gpu``: the step starts CUDA, which needs a zygote that has
        not started the GPU driver."""
        key = tuple(sorted((k, v) for k, v in env.items() if k not in PER_STEP_ENV))
        async with self._lock:
            zygote = self.by_env.get(key)
            if zygote is None or not zygote.alive:
                if zygote is not None:
                    zygote.close()
                    del self.by_env[key]
                if self.failed_starts.get(key, 0) >= self.MAX_FAILED_STARTS:
                    return None
                os.makedirs(self.cwd, exist_ok=True)
                zygote = Zygote({**dict(key), MARKER: ZYGOTE_MARK}, self.cwd)
                self.starts += 1
                try:
                    await zygote.start()
                except ZygoteGone as exc:
                    zygote.close()
                    failed = self.MAX_FAILED_STARTS if exc.final else self.failed_starts.get(key, 0) + 1
                    self.failed_starts[key] = failed
                    log.warning("sandbox: zygote start failed (%s); this step starts a fresh worker%s", exc,
                                ", and so will every step of its environment" if failed >= self.MAX_FAILED_STARTS
                                else "")
                    return None
                self.by_env[key], self.failed_starts[key] = zygote, 0
        if gpu and zygote.driver:
            if key not in self.warned_driver:
                self.warned_driver.add(key)
                log.warning("sandbox: the zygote's imports started the GPU driver; GPU steps start fresh workers")
            return None
        try:
            return await zygote.spawn(env, cwd, passed)
        except ZygoteGone as exc:
            zygote.close()
            log.warning("sandbox: %s; this step starts a fresh worker, the next one a new zygote", exc)
            return None

    def close(self) -> None:
        for zygote in self.by_env.values():
            zygote.close()
        self.by_env.clear()


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m sandbox.zygote CONTROL_FD", file=sys.stderr)
        return 2
    return serve(socket.socket(fileno=int(sys.argv[1])))


if __name__ == "__main__":
    sys.exit(main())
