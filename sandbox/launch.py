"""One worker process of the pool (``python -m sandbox.worker``, or for a host run step a fork of the
pool's zygote, sandbox/zygote.py): its request, environment, limits, key and gate socket, the
watchdog that kills it for forking or memory, and its tagged verdict line.

The pool (sandbox/pool.py) decides *what* runs (a compile, run or probe step, on which device, how
often); this module *how* one such process runs and what its outcome is.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import secrets
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from sandbox import devices, sweep
from sandbox.build import step_path
from sandbox.config import SandboxConfig
from sandbox.device_gate import DeviceGate, Grant, serve_gate
from sandbox.result import SandboxResult
from sandbox.wire import KEY_BYTES, MARKER, MAX_LINE_BYTES, Isolation, Limits, StepRequest, read_result_line
from sandbox.zygote import ForkedWorker, Zygotes

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH",
              "CUDA_ROOT", "CC", "CXX", "NVCC_CCBIN", "NVIDIA_DRIVER_CAPABILITIES", "TRITON_PTXAS_PATH",
              "TRITON_LIBCUDA_PATH", "VIRTUAL_ENV")
WorkerProcess = asyncio.subprocess.Process | ForkedWorker   # a fresh interpreter, or forked by a zygote
_ENV_DENY = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|^AWS_|^WANDB_|^HF_|^HUGGING|^GITHUB|"
                       r"^SSH_|^GOOGLE_|^AZURE_|^OPENAI|^ANTHROPIC", re.IGNORECASE)


def scrubbed_env(extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment reduced to an allowlist, secrets never included, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_ALLOW and not _ENV_DENY.search(k)}
    env.update(extra)
    return {k: v for k, v in env.items() if not _ENV_DENY.search(k) or k == MARKER}


@dataclasses.dataclass
class StepOutcome:
    data: dict[str, Any] | None      # the worker's result JSON, None when the worker gave none
    killed_for: str | None = None    # "timeout" | "processes" | "memory" when the pool killed it
    detail: str = ""
    wall_s: float = 0.0
    device: tuple[Any, str] | None = None  # the gate's token this step held: (GPU index, capability)
    held_s: float | None = None            # how long it held it (admission to its processes gone)
    gate_s: dict[str, float] = dataclasses.field(default_factory=dict)  # device_exclusive, device_wait, ...
    overlapped: bool = False               # another step held a reservation on its device meanwhile


class Launcher:
    """Starts the pool's worker processes and keeps track of the live ones (``live``: killed on close)."""

    def __init__(self, cache: Path, narrow_header_dir: str):
        self.cache, self.narrow_header_dir = cache, narrow_header_dir
        self.live: set[WorkerProcess] = set()
        self.next_core = 0
        self.zygotes = Zygotes(str(cache / "zygote"))

    def cpu_set(self, cfg: SandboxConfig) -> list[int]:
        """The cores one step may run on (in turn over the machine's): affinity, not advice."""
        cores = sorted(os.sched_getaffinity(0))
        n = min(cfg.cpu_threads, len(cores))
        start = self.next_core % len(cores)
        self.next_core += n
        return [cores[(start + i) % len(cores)] for i in range(n)]

    async def step(self, req: dict[str, Any], mode: str, bkey: str, workdir: Path, eval_id: str,
                    cfg: SandboxConfig, backend: str, gpu: tuple[int, str] | None, arch: str,
                    limit_s: float, drop: tuple[str, ...] = (), gate: DeviceGate | None = None,
                    visible: int | None = None, need: int | None = None,
                    ref_time: tuple[Any, Any] | None = None) -> StepOutcome:
        """One worker process. With a ``gate`` the worker prepares first and the device is taken only
        when it says it is ready (``need`` reserved, None: alone); ``limit_s`` counts from then (and
        bounds the preparation too); time spent waiting for an exclusive window is not counted."""
        build_dir = self.cache / "builds" / bkey
        build_dir.mkdir(parents=True, exist_ok=True)
        (workdir / "tmp").mkdir(parents=True, exist_ok=True)
        # RLIMIT_AS stops CUDA (the driver reserves huge address ranges): host steps only
        use_as = backend == "cpu" or (backend == "triton" and req.get("device", "cpu") == "cpu" and mode != "probe")
        step = StepRequest(
            **req, workdir=str(workdir), build_dir=str(build_dir),
            pch_root=str(self.cache / "pch") if cfg.precompiled_header else None,
            narrow_header_dir=self.narrow_header_dir if cfg.narrow_cuda_header else None,
            split_root=str(self.cache / "split") if cfg.split_build and (
                backend == "cpu" or (backend == "cuda" and cfg.split_build_cuda)) else None,
            output_tail_bytes=cfg.output_tail_bytes,
            limits=Limits(memory_bytes=cfg.memory_limit_bytes if use_as else None, open_files=cfg.max_open_files,
                          processes=cfg.max_processes, cpu_s=cfg.cpu_time_limit_s,
                          file_size_bytes=cfg.max_file_size_bytes),
            isolation=Isolation(network=cfg.block_network, writes=cfg.restrict_writes, pids=cfg.pid_namespace,
                                drop=list(drop), shm_bytes=cfg.shm_bytes, cpus=self.cpu_set(cfg),
                                dir_bytes=cfg.max_build_dir_bytes, dir_files=cfg.max_build_dir_files),
            gated=gate is not None)
        marker = f"{eval_id}-{mode}-{uuid.uuid4().hex[:6]}"
        extra = {"HOME": str(workdir), "TMPDIR": str(workdir / "tmp"), "TORCH_EXTENSIONS_DIR": str(build_dir),
                 "PATH": step_path(),  # one ninja for every step of every pool (sandbox/build.py)
                 "MAX_JOBS": str(cfg.max_jobs), "OMP_NUM_THREADS": str(cfg.cpu_threads),
                 "MKL_NUM_THREADS": str(cfg.cpu_threads), "PYTHONDONTWRITEBYTECODE": "1",
                 "PYTHONNOUSERSITE": "1", "PYTHONPATH": PROJECT_ROOT, "TRITON_CACHE_DIR": str(build_dir / "triton"),
                 # nvidia-smi numbers GPUs in PCI order; make CUDA agree. A gated step sees none
                 # until the pool grants it one.
                 "CUDA_VISIBLE_DEVICES": str(gpu[0]) if gpu else "" if visible is None else str(visible),
                 "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                 # glibc's per-thread cache hands small blocks back without the NaN fill of
                 # protocol.poison_host_allocations (1.5 % of small allocations read stale, measured):
                 # without it, an output the candidate never wrote reads as NaN at any size
                 "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0",
                 MARKER: marker}
        if arch:
            extra["TORCH_CUDA_ARCH_LIST"] = arch
        if backend == "triton" and gpu is None:
            extra["TRITON_INTERPRET"] = "1"
        # The worker's stdout is a pipe that a leftover process may reopen through /proc and write
        # to (where neither a PID namespace nor Landlock keeps it out): only a line tagged with this
        # step's key is its verdict. The key reaches the worker's outer process alone (sandbox.worker
        # main), never through the request, the environment, argv or a file.
        key = new_step_key()
        theirs: socket.socket | None = None
        gate_ours = gate_theirs = None
        t0 = time.monotonic()
        try:
            theirs = key_socket(key)
            step.key_fd = theirs.fileno()
            passed = [theirs.fileno()]
            if gate is not None:
                gate_ours, gate_theirs = socket.socketpair()
                step.gate_fd = gate_theirs.fileno()
                passed.append(gate_theirs.fileno())
            # a run step forks from a pre-imported zygote (sandbox/zygote.py): a host step always, a GPU
            # step where zygote_gpu_steps is on; a compile or probe step, or one the zygote cannot
            # fork, starts a fresh interpreter
            on_host = gpu is None and visible is None
            forkable = cfg.zygote_worker and mode == "run" and (on_host or cfg.zygote_gpu_steps)
            proc = (await self.zygotes.fork(scrubbed_env(extra), str(workdir), passed, gpu=not on_host)
                    if forkable else None)
            if proc is None:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "sandbox.worker", stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(workdir),
                    env=scrubbed_env(extra), start_new_session=True, limit=MAX_LINE_BYTES, pass_fds=tuple(passed))
        except OSError as exc:
            if gate_ours is not None:
                gate_ours.close()
            return StepOutcome(None, detail=f"could not start the worker: {exc}")
        finally:
            for sock in (theirs, gate_theirs):
                if sock is not None:
                    sock.close()  # the worker has its own copy now
        self.live.add(proc)
        watch: dict[str, str] = {}
        watchdog = asyncio.ensure_future(self._watch(proc, cfg, use_as, watch,
                                                     build_dir if mode == "compile" else None))
        stderr_task = asyncio.ensure_future(proc.stderr.read())  # type: ignore[union-attr]
        data: dict[str, Any] | None = None
        untagged = 0
        # the gate's server moves the deadline (waits are not run time) and records the grant and its times
        clock: dict[str, Any] = {"deadline": time.monotonic() + limit_s}
        served = None
        if gate is not None and gate_ours is not None:
            served = asyncio.ensure_future(serve_gate(gate_ours, gate, need, limit_s, clock,
                                                      lambda on: freeze(proc.pid, marker, on),
                                                      lambda fp: devices.estimate(fp, cfg), ref_time))
        try:
            await write_raw(proc, step.to_json(), close=True)
            while True:
                left = clock["deadline"] - time.monotonic()
                if left <= 0:
                    raise asyncio.TimeoutError
                try:
                    line = await asyncio.wait_for(proc.stdout.readline(),  # type: ignore[union-attr]
                                                  timeout=min(left, 1.0))
                except asyncio.TimeoutError:
                    continue  # look at the deadline again: a wait for the device may have moved it
                if not line:
                    break
                data = read_result_line(line, key)
                if data is not None:
                    clock["verdict"] = time.monotonic()
                    break  # the first tagged line: the worker writes no other, and nothing else can tag one
                untagged += 1
        except asyncio.TimeoutError:
            watch.setdefault("reason", "timeout")
        except (BrokenPipeError, ConnectionResetError, ValueError):
            pass  # the worker died (or wrote an endless line): no verdict, reported below
        finally:
            watchdog.cancel()
            if served is not None:
                served.cancel()
            kill_group(proc)
            try:
                stderr = await asyncio.wait_for(stderr_task, timeout=5.0)
                await asyncio.wait_for(proc.wait(), timeout=5.0)
            except asyncio.TimeoutError:
                stderr_task.cancel()
                stderr = b""
            # the device goes back only once every process of the step is gone: their CUDA contexts
            # (and memory) go with them, so the next step never finds the GPU's memory taken
            await asyncio.to_thread(sweep.wait_gone, marker)
            if served is not None:
                await asyncio.gather(served, return_exceptions=True)  # cancelled above: gone before release
            grant: Grant | None = clock.get("grant")
            if grant is not None:
                await gate.release(grant)  # type: ignore[union-attr]
            if gate_ours is not None:
                gate_ours.close()
            self.live.discard(proc)
            release_transport(proc)
        now = time.monotonic()
        gate_s = {k: v for k, v in clock.items() if k in ("device_exclusive", "device_shared")}
        if grant is not None and "verdict" in clock:  # the verdict to the memory back: processes ending
            gate_s["device_tail"] = now - clock["verdict"]
        if grant is not None and "exclusive_from" in clock and "device_exclusive" not in gate_s:
            gate_s["device_exclusive"] = now - clock["exclusive_from"]  # killed inside its window
        extra_out = {"wall_s": now - t0, "device": gate.token if grant is not None else None,  # type: ignore[union-attr]
                     "held_s": now - clock["admitted"] if grant is not None else None,
                     "gate_s": gate_s, "overlapped": bool(grant and grant.overlapped)}
        if "reason" in watch:
            return StepOutcome(None, killed_for=watch["reason"], detail=watch.get("detail", ""), **extra_out)
        if data is None:  # as a worker that wrote nothing: lost (run again, then a sandbox error)
            ignored = f"; {untagged} untagged line(s) ignored" if untagged else ""
            detail = f"worker exit code {proc.returncode}{ignored}; stderr: {stderr.decode('utf-8', 'replace')[-500:]}"
            return StepOutcome(None, detail=detail, **extra_out)
        return StepOutcome(data, **extra_out)

    async def _watch(self, proc: WorkerProcess, cfg: SandboxConfig, rlimit_as: bool,
                     watch: dict[str, str], build_dir: Path | None = None) -> None:
        """Kill the worker's group when it forks too much, (without RLIMIT_AS) uses too much memory,
        or (a compile step, ``build_dir``) fills its build dir past the quota: the one place an
        answer writes that outlives its step, and on disk."""
        ticks = 0
        while True:
            await asyncio.sleep(0.25)
            ticks += 1
            count, rss = await asyncio.to_thread(_tree_usage, proc.pid)
            over = await asyncio.to_thread(over_quota, build_dir, cfg) if build_dir and ticks % 4 == 0 else None
            if over:
                watch.update(reason="quota", detail=over + ": killed")
            elif count > cfg.max_processes:
                watch.update(reason="processes",
                             detail=f"more than {cfg.max_processes} processes (a fork bomb?): killed")
            elif not rlimit_as and rss > cfg.memory_limit_bytes:
                watch.update(reason="memory", detail=f"resident memory {rss / 2**30:.1f} GiB over the limit "
                                                     f"{cfg.memory_limit_bytes / 2**30:.1f} GiB: killed")
            else:
                continue
            kill_group(proc)
            return


def step_result(out: StepOutcome, mode: str, cfg: SandboxConfig) -> SandboxResult:
    """The SandboxResult of a worker's outcome: the pool's kill reasons first, then the worker's own verdict."""
    if out.killed_for == "timeout":
        kind = "compile_timeout" if mode == "compile" else "timeout"
        limit = cfg.compile_timeout_s if mode == "compile" else cfg.run_timeout_s
        return SandboxResult.failure(kind, f"{mode} step ran past its wall limit ({limit:g} s)",
                                  stage="compile" if mode == "compile" else "correctness")
    if out.killed_for == "processes":
        return SandboxResult.failure("runtime_error", out.detail, stage="correctness")
    if out.killed_for == "quota":
        return SandboxResult.failure("compile_error", out.detail, stage="compile")
    if out.killed_for == "memory":
        return SandboxResult.failure("memory_limit", out.detail, stage="correctness")
    if out.data is None:
        return SandboxResult.failure("sandbox_error", f"the {mode} worker was lost twice: {out.detail}")
    return SandboxResult.from_dict(out.data)


def kill_group(proc: WorkerProcess) -> None:
    # The worker leads its own session; killing its group kills the PID-namespace init with it,
    # and the kernel then kills everything left in the namespace.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def freeze(pid: int, marker: str, on: bool) -> None:
    """Stop (or resume) a step's processes: its group, and what carries its marker outside it."""
    sig = signal.SIGSTOP if on else signal.SIGCONT
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    sweep.signal_marked(marker, sig)


def new_step_key() -> bytes:
    """A fresh key for each worker process (tests replace this to know it)."""
    return secrets.token_bytes(KEY_BYTES)


def key_socket(key: bytes) -> socket.socket:
    """The worker's end of a socket pair that already holds ``key`` (ours is closed: the worker
    reads the key, then end of file). A socket, unlike a pipe, cannot be reopened through
    /proc/<pid>/fd, so no other process can read the key while it waits there."""
    ours, theirs = socket.socketpair()
    try:
        ours.sendall(key)
    except OSError:
        theirs.close()
        raise
    finally:
        ours.close()
    return theirs


async def write_raw(proc: WorkerProcess, data: bytes, close: bool) -> None:
    assert proc.stdin is not None
    proc.stdin.write(data)
    await proc.stdin.drain()
    if close:
        proc.stdin.close()


def over_quota(build_dir: Path, cfg: SandboxConfig) -> str | None:
    """Why a build dir is over its quota (bytes, files), or None."""
    total = files = 0
    for root, _dirs, names in os.walk(build_dir):
        for name in names:
            files += 1
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    if total > cfg.max_build_dir_bytes or files > cfg.max_build_dir_files:
        return (f"the build left {files} files, {total / 2**20:.0f} MiB in its build dir, over the quota "
                f"({cfg.max_build_dir_files} files, {cfg.max_build_dir_bytes / 2**20:.0f} MiB)")
    return None


def worker_processes(pid: int | None = None) -> list[psutil.Process]:
    """The step workers (outer processes) of the pools in process ``pid`` (this one by default): its
    children started as ``sandbox.worker`` and the children of its zygotes (sandbox/zygote.py)."""
    out = []
    for child in psutil.Process(pid or os.getpid()).children():
        try:
            title = " ".join(child.cmdline())
            if "sandbox.worker" in title:
                out.append(child)
            elif "sandbox.zygote" in title:
                out += child.children()
        except psutil.Error:
            continue
    return out


def _tree_usage(pid: int) -> tuple[int, int]:
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0, 0
    rss = 0
    for p in procs:
        try:
            rss += p.memory_info().rss
        except psutil.Error:
            continue
    return len(procs), rss


def release_transport(proc: WorkerProcess) -> None:
    """Close the subprocess transport now. Left to the garbage collector, it is finalised after
    the event loop has closed ("Event loop is closed" warnings), and such finalizers running
    inside CPython 3.11's AST constructor made a later ``ast.parse`` fail (seen in CI)."""
    transport = getattr(proc, "_transport", None)  # asyncio exposes no public close for Process
    if transport is not None:
        transport.close()
