"""EvalPool: many sandboxed evaluations at once, from an asyncio event loop.

One evaluation = an optional compile step (a worker process that imports the candidate, so
``load_inline`` builds into a content-addressed build dir) and a run step (a fresh worker that
loads that build, checks correctness and times). Builds are cached by content and deduplicated:
identical candidates in flight share one build (a future per key in this pool, a file lock across
pools). Reference timings are cached per (task source, device). Run steps on a GPU hold that GPU
alone (timings are not disturbed by a neighbour); compile steps use CPU slots only.

A crash, hang, fork bomb or memory hog costs only its own evaluation: the pool kills the worker's
whole process group (and its PID namespace), a watchdog enforces the process count and, where
RLIMIT_AS cannot be used (CUDA), resident memory.
"""
from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from sandbox import sweep
from sandbox.build import build_key, pch_allowed, task_key, write_narrow_header
from sandbox.config import BACKENDS, EvalConfig, validate
from sandbox.device_gate import DeviceGate, Grant, serve_gate
from sandbox.gpu_probe import IsolationProbe, ProbeVerdict, choose_isolation
from sandbox.result import EvalResult
from sandbox.wire import KEY_BYTES, MARKER, MAX_LINE_BYTES, Isolation, Limits, StepRequest, read_result_line

_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH",
              "CUDA_ROOT", "CC", "CXX", "NVCC_CCBIN", "NVIDIA_DRIVER_CAPABILITIES", "TRITON_PTXAS_PATH",
              "TRITON_LIBCUDA_PATH", "VIRTUAL_ENV")
_ENV_DENY = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|^AWS_|^WANDB_|^HF_|^HUGGING|^GITHUB|"
                       r"^SSH_|^GOOGLE_|^AZURE_|^OPENAI|^ANTHROPIC", re.IGNORECASE)
_MARKER = MARKER
# Per-call overrides of the configuration that make sense for one evaluation.
_OVERRIDABLE = ("correctness_trials", "seed", "warmup_runs", "timing_runs", "timing_input_sets",
                "compile_timeout_s", "run_timeout_s", "memory_limit_bytes", "excessive_speedup",
                "cpu_threads", "poison_bytes", "gpu_flush_bytes", "cpu_flush_bytes")
_MAX_LINE = MAX_LINE_BYTES
# what a run step should have in force; the pool names any that is missing once (reads are open
# without landlock_read, unix sockets without seccomp, the host's processes without pidns, ...)
_EXPECTED_MEASURES = ("landlock_fs", "landlock_read", "pidns", "netns", "seccomp", "caps_dropped", "no_new_privs")
log = logging.getLogger("sandbox.pool")
_KEY_BYTES = KEY_BYTES
# Compile verdicts that depend only on the source: cached with the build.
_CACHEABLE_FAILURES = ("compile_error", "load_error")


def scrubbed_env(extra: dict[str, str]) -> dict[str, str]:
    """The parent's environment reduced to an allowlist, secrets never included, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_ALLOW and not _ENV_DENY.search(k)}
    env.update(extra)
    return {k: v for k, v in env.items() if not _ENV_DENY.search(k) or k == _MARKER}


def detect_gpus() -> list[tuple[int, str]]:
    """(index, compute capability) of each visible GPU, from nvidia-smi; [] without one."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        idx, _, cap = line.partition(",")
        if idx.strip().isdigit():
            gpus.append((int(idx), cap.strip()))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        keep = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        gpus = [g for g in gpus if g[0] in keep]
    return gpus


def as_eval_config(cfg: Any) -> EvalConfig:
    """An EvalConfig from itself, or from a Hydra/OmegaConf node or a dict of the same keys."""
    if isinstance(cfg, EvalConfig):
        return cfg
    from omegaconf import OmegaConf

    obj: EvalConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EvalConfig), cfg))  # type: ignore
    validate(obj)
    return obj


@dataclasses.dataclass
class _StepOutcome:
    data: dict[str, Any] | None      # the worker's result JSON, None when the worker gave none
    killed_for: str | None = None    # "timeout" | "processes" | "memory" when the pool killed it
    detail: str = ""
    wall_s: float = 0.0
    device: tuple[Any, str] | None = None  # the gate's token this step held: (GPU index, capability)
    held_s: float | None = None            # how long it held it (admission to its processes gone)
    gate_s: dict[str, float] = dataclasses.field(default_factory=dict)  # device_exclusive, device_wait, ...
    overlapped: bool = False               # another step held a reservation on its device meanwhile


class EvalPool:
    """``await pool.evaluate(ref_src, candidate_src, backend)`` -> :class:`EvalResult`."""

    def __init__(self, cfg: EvalConfig | Any, isolation_probe: IsolationProbe | None = None):
        """``isolation_probe``: what gates GPU run steps when ``gpu_isolation_probe`` is on (default:
        the CUDA probe of sandbox.gpu_probe; tests give one that gates CPU run steps)."""
        self.cfg = cfg = as_eval_config(cfg)
        self.isolation_probe = isolation_probe or IsolationProbe()
        self.probe_verdict: ProbeVerdict | None = None  # set once the probe has decided
        self._probe_lock = asyncio.Lock()
        self._own_cache = cfg.cache_dir is None
        self.cache = Path(cfg.cache_dir or tempfile.mkdtemp(prefix="sandbox_cache_"))
        for sub in ("builds", "pch", "refs", "work"):
            (self.cache / sub).mkdir(parents=True, exist_ok=True)
        self._narrow_header_dir = str(write_narrow_header(self.cache / "narrow_header"))
        self._slots = asyncio.Semaphore(cfg.max_concurrent)
        self._compile_slots = asyncio.Semaphore(cfg.compile_workers)
        self._building: dict[str, asyncio.Task] = {}
        self._pch_building: dict[str, asyncio.Task] = {}
        self._pch_requests: Counter[str] = Counter()
        self._ref_ms: dict[str, float] = {}
        self._live: set[asyncio.subprocess.Process] = set()
        self._gpus: list[tuple[int, str]] | None = None
        # one gate per GPU: a run step is given its GPU when it starts (so its trusted processes
        # start CUDA there while it prepares), is admitted once its task's footprint fits, shares the
        # GPU for load and correctness and holds it alone for timing (sandbox/device_gate.py)
        self._gpu_gates: dict[int, DeviceGate] = {}
        self._gpu_load: Counter[int] = Counter()   # run steps given each GPU and not yet done
        self._cpu_gate: DeviceGate | None = None
        self._footprints: dict[str, int] = {}      # task key -> bytes one run step reserves on its GPU
        self._torch_version: str | None = None
        self._started = time.monotonic()
        self._stats: Counter[str] = Counter()
        self._compile_times: list[float] = []
        self._closed = False
        self._next_core = 0
        self._said_open = False

    # --- public -------------------------------------------------------------------------------

    async def evaluate(self, ref_src: str, candidate_src: str, backend: str | None = None,
                       key: str | None = None, **overrides: Any) -> EvalResult:
        """Compile (cached), check and time ``candidate_src`` against ``ref_src``. Never raises for
        anything the candidate does; ``key`` labels the evaluation (work dir name, logs)."""
        if self._closed:
            raise RuntimeError("EvalPool is closed")
        backend = backend or self.cfg.backend
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
        unknown = sorted(set(overrides) - set(_OVERRIDABLE))
        if unknown:
            raise TypeError(f"EvalPool.evaluate: unknown override(s) {unknown}; allowed: {list(_OVERRIDABLE)}")
        cfg = dataclasses.replace(self.cfg, **overrides)
        async with self._slots:
            t0 = time.monotonic()
            result = await self._evaluate(ref_src, candidate_src, backend, key, cfg)
            result.wall_s["total"] = round(time.monotonic() - t0, 3)
        self._stats["evaluations"] += 1
        self._stats[f"error/{result.error_kind}" if result.error_kind else "error/none"] += 1
        self._stats["correct"] += int(result.correct)
        return result

    async def headers_ready(self) -> None:
        """Wait for the precompiled headers being built (benchmarks: measure the steady state)."""
        await asyncio.gather(*self._pch_building.values(), return_exceptions=True)

    def stats(self) -> dict[str, float]:
        minutes = max((time.monotonic() - self._started) / 60.0, 1e-9)
        out: dict[str, float] = {k: float(v) for k, v in self._stats.items()}
        out["evals_per_min"] = self._stats["evaluations"] / minutes
        if self._compile_times:
            ts = sorted(self._compile_times)
            out["compile_s_p50"] = statistics.median(ts)
            out["compile_s_p95"] = ts[min(len(ts) - 1, int(round(0.95 * (len(ts) - 1))))]
        out.setdefault("cache_hits", 0.0)
        return out

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._building.values()) + list(self._pch_building.values()):
            task.cancel()
        for proc in list(self._live):
            self._kill_group(proc)
        await asyncio.gather(*self._building.values(), *self._pch_building.values(), return_exceptions=True)
        if self._own_cache:
            await asyncio.to_thread(shutil.rmtree, self.cache, True)

    async def __aenter__(self) -> "EvalPool":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # --- one evaluation -----------------------------------------------------------------------

    async def _evaluate(self, ref_src: str, cand_src: str, backend: str, key: str | None,
                        cfg: EvalConfig) -> EvalResult:
        gpus = await self._gpu_list() if backend in ("cuda", "triton") else []
        if backend == "cuda" and not gpus:
            return EvalResult.failure("sandbox_error", "the cuda backend needs a GPU and none is visible",
                                      backend=backend)
        on_gpu = bool(gpus)
        arch = cfg.cuda_arch or (gpus[0][1] if gpus else "")
        bkey = build_key(cand_src, backend, arch, await self._torch())
        eval_id = f"{_safe(key) + '-' if key else ''}{uuid.uuid4().hex[:10]}"
        eval_dir = self.cache / "work" / eval_id
        try:
            compiled = await self._ensure_built(bkey, cand_src, backend, arch, cfg, eval_dir)
            if compiled.get("error_kind"):
                res = EvalResult.from_dict({**compiled, "backend": backend, "trials": cfg.correctness_trials})
                res.cache_hit = bool(compiled.get("cache_hit"))
                return res
            device_name = f"cuda:{arch}" if on_gpu else "cpu"
            # "p2": times of the second protocol (the judge's clock around each call), never mixed with
            # a persistent cache's older ones
            tkey = task_key(ref_src, f"p2:{backend}:{device_name}:{cfg.timing_runs}:{cfg.cpu_threads}")
            ref_ms = self._ref_ms.get(tkey) or self._load_ref_ms(tkey)
            res = await self._run(ref_src, cand_src, backend, bkey, arch, cfg, eval_dir, eval_id, on_gpu, ref_ms,
                                  tkey)
            if res.timed and res.ref_runtime_ms and ref_ms is None and res.error_kind is None:
                self._store_ref_ms(tkey, res.ref_runtime_ms)
            res.cache_hit = bool(compiled.get("cache_hit"))
            if "compile" in compiled.get("wall_s", {}) and not res.cache_hit:
                res.wall_s["compile"] = compiled["wall_s"]["compile"]
            return res
        finally:
            if not cfg.keep_workdirs:
                await asyncio.to_thread(shutil.rmtree, eval_dir, True)

    async def _run(self, ref_src: str, cand_src: str, backend: str, bkey: str, arch: str, cfg: EvalConfig,
                   eval_dir: Path, eval_id: str, on_gpu: bool, ref_ms: float | None, tkey: str) -> EvalResult:
        # a run step killed while torch held its build lock would stall every later load
        await asyncio.to_thread(_remove_stale_batons, self.cache / "builds" / bkey, 120.0)
        gpu_index = self._pick_gpu() if on_gpu else None
        gate = self._gpu_gates[gpu_index] if gpu_index is not None else self._device_gate(False)
        try:
            return await self._run_on(ref_src, cand_src, backend, bkey, arch, cfg, eval_dir, eval_id, on_gpu,
                                      ref_ms, gate, gpu_index, tkey)
        finally:
            if gpu_index is not None:
                self._gpu_load[gpu_index] -= 1

    def _pick_gpu(self) -> int:
        """The GPU with the fewest run steps given to it."""
        assert self._gpus
        index = min((g[0] for g in self._gpus), key=lambda i: self._gpu_load[i])
        self._gpu_load[index] += 1
        return index

    async def _run_on(self, ref_src: str, cand_src: str, backend: str, bkey: str, arch: str, cfg: EvalConfig,
                      eval_dir: Path, eval_id: str, on_gpu: bool, ref_ms: float | None, gate: DeviceGate | None,
                      gpu_index: int | None, tkey: str) -> EvalResult:
        drop: tuple[str, ...] = ()
        if cfg.gpu_isolation_probe and self.isolation_probe.applies(backend, on_gpu):
            drop = (await self._probe(backend, gate, arch, cfg, eval_dir)).dropped
        timed = backend == "cpu" or on_gpu
        req = dict(mode="run", task_src=ref_src, candidate_src=cand_src, backend=backend,
                   device="cuda:0" if on_gpu else "cpu", trials=cfg.correctness_trials, seed=cfg.seed,
                   warmup=cfg.warmup_runs, runs=cfg.timing_runs, input_sets=cfg.timing_input_sets,
                   checked_share=cfg.checked_share,
                   tolerance={k: dataclasses.asdict(v) for k, v in cfg.tolerance.items()},
                   flush_bytes=cfg.gpu_flush_bytes if on_gpu else cfg.cpu_flush_bytes,
                   poison_bytes=cfg.poison_bytes, excessive_speedup=cfg.excessive_speedup,
                   cpu_threads=cfg.cpu_threads, ref_runtime_ms=ref_ms, timeout_s=_run_limit(cfg, ref_ms), timed=timed)
        limit = req["timeout_s"] + max(30.0, req["timeout_s"])
        # a task's first GPU step runs alone and measures what later ones reserve; the host's slots
        # are counted, not measured
        need: int | None = self._footprints.get(tkey, -1) if on_gpu else 1  # -1: the judge's estimate
        attempt = lost = 0
        while True:
            out = await self._step(req, "run", bkey, eval_dir / f"run{attempt}", eval_id, cfg, backend,
                                   None, arch, limit, drop, gate, visible=gpu_index, need=need)
            attempt += 1
            if out.data is None and out.killed_for is None:
                self._stats["lost_workers"] += 1
                lost += 1
                if lost <= cfg.lost_worker_retries:
                    continue
            if out.overlapped and need is not None and _maybe_crowded(out):
                # a timeout or out-of-memory while others shared the device is never blamed on the
                # answer before it is seen alone
                self._stats["rerun_alone"] += 1
                need = None
                continue
            break
        if on_gpu and out.data is not None:  # each process's own peak: others on the device do not change it
            self._learn_footprint(tkey, out.data.get("task_profile"), cfg)
        res = self._verdict(out, "run", cfg)
        res.backend, res.trials = backend, cfg.correctness_trials
        self._say_what_is_open(res.isolation)
        gpu = out.device
        res.device = f"cuda:{gpu[0]} (sm {gpu[1]})" if on_gpu and gpu else "cpu"
        if out.held_s is not None:
            res.wall_s["device_held"] = round(out.held_s, 3)
        for k, v in out.gate_s.items():
            res.wall_s[k] = round(v, 3)
        if attempt > 1 and need is None and out.held_s is not None:
            res.wall_s["reran_alone"] = 1.0
        if not timed:
            res.timed, res.speedup, res.new_runtime_ms, res.ref_runtime_ms = False, None, None, None
        return res

    def _say_what_is_open(self, applied: list[str]) -> None:
        """Once per pool and backend kind: one line naming the confinement this host could not give
        (reads readable, sockets reachable, ...), so a user sees it at the start of a run."""
        if not applied or self._said_open:
            return
        missing = [m for m in _EXPECTED_MEASURES if m not in applied]
        self._said_open = True
        if missing:
            log.warning("sandbox: this host runs answers without %s; docs/sandbox.md 'Where the OS cannot "
                        "confine' says what that leaves open", ", ".join(missing))

    def _cpu_set(self, cfg: EvalConfig) -> list[int]:
        """The cores one step may run on (in turn over the machine's): affinity, not advice."""
        cores = sorted(os.sched_getaffinity(0))
        n = min(cfg.cpu_threads, len(cores))
        start = self._next_core % len(cores)
        self._next_core += n
        return [cores[(start + i) % len(cores)] for i in range(n)]

    def _device_gate(self, on_gpu: bool) -> DeviceGate | None:
        """With ``cpu_run_slots``, the host's gate: that many run steps share it for correctness, one
        holds it alone for timing; None: nothing."""
        if self.cfg.cpu_run_slots is None:
            return None
        if self._cpu_gate is None:
            self._cpu_gate = DeviceGate((None, "host"), self.cfg.cpu_run_slots, self.cfg.admission_overtake_s)
        return self._cpu_gate

    def _learn_footprint(self, tkey: str, profile: Any, cfg: EvalConfig) -> None:
        """What a run step of this task reserves on its GPU, from a step that ran alone: the judge's
        peak (inputs, check set, outputs it holds), the reference runner's peak twice (the
        candidate is assumed alike; the NaN poison it frees first counted on top), and a CUDA context
        per process."""
        if tkey in self._footprints or not isinstance(profile, dict):
            return
        judge, ref = profile.get("judge_peak_bytes"), profile.get("reference_peak_bytes")
        if not isinstance(judge, int) or not isinstance(ref, int):
            return
        self._footprints[tkey] = judge + 2 * ref + cfg.poison_bytes + 3 * cfg.gpu_context_bytes

    async def _probe(self, backend: str, gate: DeviceGate | None, arch: str, cfg: EvalConfig,
                     eval_dir: Path) -> ProbeVerdict:
        """Once per pool, before the first gated run step: the isolation the device survives."""
        async with self._probe_lock:
            if self.probe_verdict is not None:
                return self.probe_verdict
            grant = await gate.admit(None) if gate is not None else None  # alone
            try:
                gpu = gate.token if gate is not None and gate.token[0] is not None else None
                return await self._probe_holding(backend, gpu, arch, cfg, eval_dir)
            finally:
                if grant is not None:
                    await gate.release(grant)  # type: ignore[union-attr]

    async def _probe_holding(self, backend: str, gpu: tuple[int, str] | None, arch: str, cfg: EvalConfig,
                             eval_dir: Path) -> ProbeVerdict:
        async def run(dropped: tuple[str, ...]) -> tuple[bool, str, list[str] | None]:
            req = dict(mode="probe", probe_src=self.isolation_probe.src, backend=backend,
                       device="cuda:0" if gpu else "cpu", trials=0, cpu_threads=cfg.cpu_threads)
            workdir = eval_dir / f"probe-{'-'.join(dropped) or 'full'}"
            self._stats["isolation_probe_runs"] += 1
            out = await self._step(req, "probe", "isolation_probe", workdir, "isolation-probe", cfg,
                                   backend, gpu, arch, 120.0, dropped)
            if out.data is None:
                return False, f"probe worker lost ({out.killed_for or out.detail})", None
            err = out.data.get("error", "") + (f" | log: {out.data['log_tail'][-300:]}"
                                               if out.data.get("log_tail") else "")
            return bool(out.data.get("probe_ok")), err, list(out.data.get("isolation", []))

        self.probe_verdict = await choose_isolation(run)
        self._stats["isolation_dropped"] = len(self.probe_verdict.dropped)
        return self.probe_verdict

    def _verdict(self, out: _StepOutcome, mode: str, cfg: EvalConfig) -> EvalResult:
        if out.killed_for == "timeout":
            kind = "compile_timeout" if mode == "compile" else "timeout"
            limit = cfg.compile_timeout_s if mode == "compile" else cfg.run_timeout_s
            return EvalResult.failure(kind, f"{mode} step ran past its wall limit ({limit:g} s)",
                                      stage="compile" if mode == "compile" else "correctness")
        if out.killed_for == "processes":
            return EvalResult.failure("runtime_error", out.detail, stage="correctness")
        if out.killed_for == "quota":
            return EvalResult.failure("compile_error", out.detail, stage="compile")
        if out.killed_for == "memory":
            return EvalResult.failure("memory_limit", out.detail, stage="correctness")
        if out.data is None:
            return EvalResult.failure("sandbox_error", f"the {mode} worker was lost twice: {out.detail}")
        return EvalResult.from_dict(out.data)

    # --- builds -------------------------------------------------------------------------------

    async def _ensure_built(self, bkey: str, cand_src: str, backend: str, arch: str, cfg: EvalConfig,
                            eval_dir: Path) -> dict[str, Any]:
        """The compile verdict for ``bkey``: from the cache, from a build in flight, or by building."""
        marker = self.cache / "builds" / f"{bkey}.json"
        if marker.exists():
            self._stats["cache_hits"] += 1
            return {**json.loads(marker.read_text()), "cache_hit": True}
        if not _needs_compile_step(cand_src):
            return {"stage": "compile"}
        task = self._building.get(bkey)
        if task is not None:
            self._stats["deduplicated_builds"] += 1
            verdict = await asyncio.shield(task)
            return {**verdict, "cache_hit": True}
        task = asyncio.ensure_future(self._build(bkey, cand_src, backend, arch, cfg, eval_dir, marker))
        self._building[bkey] = task
        task.add_done_callback(lambda _t: self._building.pop(bkey, None))
        return await asyncio.shield(task)

    async def _build(self, bkey: str, cand_src: str, backend: str, arch: str, cfg: EvalConfig,
                     eval_dir: Path, marker: Path) -> dict[str, Any]:
        async with self._compile_slots:
            lock_fd = await self._lock(self.cache / "builds" / f"{bkey}.lock")
            try:
                if marker.exists():  # another pool built it while we waited
                    self._stats["cache_hits"] += 1
                    return {**json.loads(marker.read_text()), "cache_hit": True}
                _remove_stale_batons(self.cache / "builds" / bkey, older_than_s=0.0)
                req = dict(mode="compile", candidate_src=cand_src, backend=backend, device="cpu",
                           trials=cfg.correctness_trials, cpu_threads=cfg.cpu_threads)
                t = time.monotonic()
                out = await self._step(req, "compile", bkey, eval_dir / "compile", bkey[:10], cfg, backend,
                                       None, arch, cfg.compile_timeout_s)
                res = self._verdict(out, "compile", cfg)
                seconds = round(time.monotonic() - t, 3)
                verdict = {k: v for k, v in res.to_dict().items()
                           if k in ("stage", "compiled", "error_kind", "error", "log_tail")}
                verdict["wall_s"] = {"compile": seconds}
                if res.error_kind is None:
                    over = await asyncio.to_thread(_over_quota, self.cache / "builds" / bkey, cfg)
                    if over:  # files the answer's build left behind beyond what any build needs
                        await asyncio.to_thread(shutil.rmtree, self.cache / "builds" / bkey, True)
                        verdict.update(compiled=False, error_kind="compile_error", error=over)
                        res.error_kind = "compile_error"
                if res.error_kind is None:
                    self._compile_times.append(seconds)
                    self._stats["compiles"] += 1
                if res.error_kind is None or res.error_kind in _CACHEABLE_FAILURES:
                    marker.write_text(json.dumps(verdict))
                wanted = (out.data or {}).get("pch_wanted", [])
                for flags in wanted if isinstance(wanted, list) else []:
                    # a compile step ran the answer in its own process: its report is re-checked here
                    if isinstance(flags, list) and all(isinstance(f, str) for f in flags) and pch_allowed(flags):
                        self._schedule_pch(flags)
                return verdict
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
                os.close(lock_fd)

    async def _lock(self, path: Path) -> int:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                await asyncio.sleep(0.2)

    def _schedule_pch(self, flags: list[str]) -> None:
        if not self.cfg.precompiled_header or self._closed or not pch_allowed(flags):
            return
        k = json.dumps(flags)
        self._pch_requests[k] += 1
        existing = sum(1 for p in (self.cache / "pch").iterdir() if not p.name.startswith("."))
        if (k in self._pch_building or self._pch_requests[k] < self.cfg.pch_min_builds
                or existing + len(self._pch_building) >= self.cfg.pch_max_sets):
            return
        self._pch_building[k] = asyncio.ensure_future(self._build_pch(flags))

    async def _build_pch(self, flags: list[str]) -> None:
        """Trusted (unsandboxed) build of torch/extension.h for one flag set, off the critical path."""
        async with self._compile_slots:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sandbox.build", "--pch-root", str(self.cache / "pch"),
                "--cflags", json.dumps(flags), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=scrubbed_env({"PYTHONPATH": _PROJECT_ROOT, "HOME": str(self.cache)}), start_new_session=True)
            self._live.add(proc)
            try:
                out, err = await proc.communicate()
                self._stats["pch_built" if proc.returncode == 0 else "pch_failed"] += 1
            finally:
                self._live.discard(proc)
                _release_transport(proc)

    # --- one worker process -------------------------------------------------------------------

    async def _step(self, req: dict[str, Any], mode: str, bkey: str, workdir: Path, eval_id: str,
                    cfg: EvalConfig, backend: str, gpu: tuple[int, str] | None, arch: str,
                    limit_s: float, drop: tuple[str, ...] = (), gate: DeviceGate | None = None,
                    visible: int | None = None, need: int | None = None) -> _StepOutcome:
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
            narrow_header_dir=self._narrow_header_dir if cfg.narrow_cuda_header else None,
            tail_bytes=cfg.output_tail_bytes,
            limits=Limits(memory_bytes=cfg.memory_limit_bytes if use_as else None, open_files=cfg.max_open_files,
                          processes=cfg.max_processes, cpu_s=cfg.cpu_time_limit_s,
                          file_size_bytes=cfg.max_file_size_bytes),
            isolation=Isolation(network=cfg.block_network, writes=cfg.restrict_writes, pids=cfg.pid_namespace,
                                drop=list(drop), shm_bytes=cfg.shm_bytes, cpus=self._cpu_set(cfg),
                                dir_bytes=cfg.max_build_dir_bytes, dir_files=cfg.max_build_dir_files),
            gated=gate is not None)
        marker = f"{eval_id}-{mode}-{uuid.uuid4().hex[:6]}"
        extra = {"HOME": str(workdir), "TMPDIR": str(workdir / "tmp"), "TORCH_EXTENSIONS_DIR": str(build_dir),
                 "MAX_JOBS": str(cfg.max_jobs), "OMP_NUM_THREADS": str(cfg.cpu_threads),
                 "MKL_NUM_THREADS": str(cfg.cpu_threads), "PYTHONDONTWRITEBYTECODE": "1",
                 "PYTHONNOUSERSITE": "1", "PYTHONPATH": _PROJECT_ROOT, "TRITON_CACHE_DIR": str(build_dir / "triton"),
                 # nvidia-smi numbers GPUs in PCI order; make CUDA agree. A gated step sees none
                 # until the pool grants it one.
                 "CUDA_VISIBLE_DEVICES": str(gpu[0]) if gpu else "" if visible is None else str(visible),
                 "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                 # glibc's per-thread cache hands small blocks back without the NaN fill of
                 # protocol.poison_host_allocations (1.5 % of small allocations read stale, measured):
                 # without it, an output the candidate never wrote reads as NaN at any size
                 "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0",
                 _MARKER: marker}
        if arch:
            extra["TORCH_CUDA_ARCH_LIST"] = arch
        if backend == "triton" and gpu is None:
            extra["TRITON_INTERPRET"] = "1"
        # The worker's stdout is a pipe that a leftover process may reopen through /proc and write
        # to (where neither a PID namespace nor Landlock keeps it out): only a line tagged with this
        # step's key is its verdict. The key reaches the worker's outer process alone (sandbox.worker
        # main), never through the request, the environment, argv or a file.
        key = _new_step_key()
        theirs: socket.socket | None = None
        gate_ours = gate_theirs = None
        t0 = time.monotonic()
        try:
            theirs = _key_socket(key)
            step.key_fd = theirs.fileno()
            passed = [theirs.fileno()]
            if gate is not None:
                gate_ours, gate_theirs = socket.socketpair()
                step.gate_fd = gate_theirs.fileno()
                passed.append(gate_theirs.fileno())
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sandbox.worker", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(workdir),
                env=scrubbed_env(extra), start_new_session=True, limit=_MAX_LINE, pass_fds=tuple(passed))
        except OSError as exc:
            if gate_ours is not None:
                gate_ours.close()
            return _StepOutcome(None, detail=f"could not start the worker: {exc}")
        finally:
            for sock in (theirs, gate_theirs):
                if sock is not None:
                    sock.close()  # the worker has its own copy now
        self._live.add(proc)
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
                                                      lambda on: _freeze(proc.pid, marker, on),
                                                      lambda fp: _estimate(fp, cfg)))
        try:
            await _write_raw(proc, step.to_json(), close=True)
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
            self._kill_group(proc)
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
            self._live.discard(proc)
            _release_transport(proc)
        now = time.monotonic()
        gate_s = {k: v for k, v in clock.items() if k in ("device_exclusive", "device_shared")}
        if grant is not None and "exclusive_from" in clock and "device_exclusive" not in gate_s:
            gate_s["device_exclusive"] = now - clock["exclusive_from"]  # killed inside its window
        extra_out = {"wall_s": now - t0, "device": gate.token if grant is not None else None,  # type: ignore[union-attr]
                     "held_s": now - clock["admitted"] if grant is not None else None,
                     "gate_s": gate_s, "overlapped": bool(grant and grant.overlapped)}
        if "reason" in watch:
            return _StepOutcome(None, killed_for=watch["reason"], detail=watch.get("detail", ""), **extra_out)
        if data is None:  # as a worker that wrote nothing: lost (run again, then a sandbox error)
            ignored = f"; {untagged} untagged line(s) ignored" if untagged else ""
            detail = f"worker exit code {proc.returncode}{ignored}; stderr: {stderr.decode('utf-8', 'replace')[-500:]}"
            return _StepOutcome(None, detail=detail, **extra_out)
        return _StepOutcome(data, **extra_out)

    async def _watch(self, proc: asyncio.subprocess.Process, cfg: EvalConfig, rlimit_as: bool,
                     watch: dict[str, str], build_dir: Path | None = None) -> None:
        """Kill the worker's group when it forks too much, (without RLIMIT_AS) uses too much memory,
        or (a compile step, ``build_dir``) fills its build dir past the quota: the one place an
        answer writes that outlives its step, and on disk."""
        ticks = 0
        while True:
            await asyncio.sleep(0.25)
            ticks += 1
            count, rss = await asyncio.to_thread(_tree_usage, proc.pid)
            over = await asyncio.to_thread(_over_quota, build_dir, cfg) if build_dir and ticks % 4 == 0 else None
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
            self._kill_group(proc)
            return

    @staticmethod
    def _kill_group(proc: asyncio.subprocess.Process) -> None:
        # The worker leads its own session; killing its group kills the PID-namespace init with it,
        # and the kernel then kills everything left in the namespace.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    # --- small helpers ------------------------------------------------------------------------

    async def _gpu_list(self) -> list[tuple[int, str]]:
        if self._gpus is None:
            found = await asyncio.to_thread(detect_gpus)
            if self.cfg.gpu_ids:
                caps = dict(found)
                found = [(i, caps.get(i, "")) for i in self.cfg.gpu_ids]
            self._gpus = found
            for g in found:
                share = self.cfg.gpu_memory_share
                memory = _gpu_memory().get(g[0], 0) if share > 0 else 0
                # budget 1: every step is admitted alone (the whole GPU, exclusive from the start)
                self._gpu_gates[g[0]] = DeviceGate(g, max(int(memory * share), 1), self.cfg.admission_overtake_s)
        return self._gpus

    async def _torch(self) -> str:
        if self._torch_version is None:
            from importlib.metadata import version  # no torch import in the event loop's process

            self._torch_version = version("torch")
        return self._torch_version

    def _load_ref_ms(self, tkey: str) -> float | None:
        path = self.cache / "refs" / f"{tkey}.json"
        if path.exists():
            value = float(json.loads(path.read_text())["ref_runtime_ms"])
            self._ref_ms[tkey] = value
            self._stats["ref_cache_hits"] += 1
            return value
        return None

    def _store_ref_ms(self, tkey: str, ms: float) -> None:
        self._ref_ms[tkey] = ms
        (self.cache / "refs" / f"{tkey}.json").write_text(json.dumps({"ref_runtime_ms": ms}))


def _freeze(pid: int, marker: str, on: bool) -> None:
    """Stop (or resume) a step's processes: its group, and what carries its marker outside it."""
    sig = signal.SIGSTOP if on else signal.SIGCONT
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    sweep.signal_marked(marker, sig)


def _maybe_crowded(out: _StepOutcome) -> bool:
    """A failure another step on the same device could have caused: a timeout, or out of memory."""
    if out.killed_for in ("timeout", "memory"):
        return True
    data = out.data or {}
    text = f"{data.get('error_kind')} {data.get('error')}".lower()
    return data.get("error_kind") in ("timeout", "memory_limit") or "out of memory" in text


def _estimate(fp: dict[str, Any], cfg: EvalConfig) -> int | None:
    """Bytes to admit a step on from the judge's meta-device footprint (sandbox.footprint)."""
    from sandbox.footprint import Footprint, step_estimate

    try:
        parts = [int(fp[k]) for k in ("input_bytes", "param_bytes", "output_bytes", "input_sets")]
        peak = None if fp.get("peak_bytes") is None else int(fp["peak_bytes"])
    except (KeyError, TypeError, ValueError):
        return None
    if min(parts) < 0 or (peak is not None and peak < 0):
        return None
    return step_estimate(Footprint(*parts[:3], peak), parts[3], cfg.gpu_flush_bytes, cfg.poison_bytes,
                         cfg.gpu_context_bytes)


def _gpu_memory() -> dict[int, int]:
    """Total memory of each GPU by nvidia-smi index; {} without one."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run([exe, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return {}
    found = {}
    for line in out.strip().splitlines():
        idx, _, mib = line.partition(",")
        try:
            found[int(idx)] = int(float(mib)) * 2**20
        except ValueError:
            continue
    return found


def _new_step_key() -> bytes:
    """A fresh key for each worker process (tests replace this to know it)."""
    return secrets.token_bytes(_KEY_BYTES)


def _key_socket(key: bytes) -> socket.socket:
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


async def _send_line(proc: asyncio.subprocess.Process, obj: Any, close: bool) -> None:
    await _write_raw(proc, json.dumps(obj).encode() + b"\n", close)


async def _write_raw(proc: asyncio.subprocess.Process, data: bytes, close: bool) -> None:
    assert proc.stdin is not None
    proc.stdin.write(data)
    await proc.stdin.drain()
    if close:
        proc.stdin.close()


def _run_limit(cfg: EvalConfig, ref_ms: float | None) -> float:
    """The run step's time limit, sized from the task once its reference time is known: the
    configured limit, plus ten times the calls of a step at the reference's speed (a task whose
    forward takes a second must not time out where a millisecond one would not)."""
    if not ref_ms:
        return float(cfg.run_timeout_s)
    calls = 2 * cfg.correctness_trials + cfg.warmup_runs + cfg.timing_runs * (1 + 2 * cfg.checked_share) + 2
    return float(cfg.run_timeout_s) + 10.0 * calls * ref_ms / 1000.0


def _over_quota(build_dir: Path, cfg: EvalConfig) -> str | None:
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


def _needs_compile_step(src: str) -> bool:
    # Only C++/CUDA builds are worth a process of their own; Triton compiles at first call.
    return "cpp_extension" in src or "load_inline" in src


def _remove_stale_batons(build_dir: Path, older_than_s: float) -> None:
    """torch's FileBaton ('<ext>/lock') survives a killed build and makes the next one wait forever."""
    now = time.time()
    for lock in build_dir.glob("*/lock"):
        try:
            if now - lock.stat().st_mtime >= older_than_s:
                lock.unlink()
        except OSError:
            continue


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:40]


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


def _release_transport(proc: asyncio.subprocess.Process) -> None:
    """Close the subprocess transport now. Left to the garbage collector, it is finalised after
    the event loop has closed ("Event loop is closed" warnings), and such finalizers running
    inside CPython 3.11's AST constructor made a later ``ast.parse`` fail (seen in CI)."""
    transport = getattr(proc, "_transport", None)  # asyncio exposes no public close for Process
    if transport is not None:
        transport.close()
