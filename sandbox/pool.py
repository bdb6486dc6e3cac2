"""SandboxPool: many sandboxed evaluations at once, from an asyncio event loop.

One evaluation = an optional compile step (a worker process that imports the candidate, so
``load_inline`` builds into a content-addressed build dir) and a run step (a fresh worker that
loads that build, checks correctness and times). Builds are cached by content and deduplicated:
identical candidates in flight share one build (a future per key in this pool, a file lock across
pools). Reference timings are cached per (task source, device). Run steps on a GPU hold that GPU
alone (timings are not disturbed by a neighbour); compile steps use CPU slots only.

A crash, hang, fork bomb or memory hog costs only its own evaluation: the pool kills the worker's
whole process group (and its PID namespace), a watchdog enforces the process count and, where
RLIMIT_AS cannot be used (CUDA), resident memory.

What the pool decides is here (which steps run, on which device, how often, what is cached per task);
how one worker process runs is sandbox/launch.py, the build cache sandbox/build_cache.py, the GPUs
and admission estimates sandbox/devices.py.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import re
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from sandbox import devices
from sandbox.build import build_key, build_tools, task_key, write_narrow_header
from sandbox.build_cache import BuildCache, remove_stale_batons
from sandbox.config import BACKENDS, SandboxConfig, validate
from sandbox.device_gate import DeviceGate
from sandbox.gpu_probe import IsolationProbe, ProbeVerdict, choose_isolation
from sandbox.launch import Launcher, kill_group, scrubbed_env, step_result
from sandbox.limits import call_limit, maybe_crowded, run_limit
from sandbox.result import IN_FLIGHT_STAGES, SandboxResult, mark_refused_build

__all__ = ["SandboxPool", "as_sandbox_config", "scrubbed_env"]

# Per-call overrides of the configuration that make sense for one evaluation.
_OVERRIDABLE = ("correctness_trials", "seed", "warmup_runs", "timing_runs", "timing_budget_s", "timing_input_sets",
                "compile_timeout_s", "run_timeout_s", "call_timeout_floor_s", "call_timeout_ref_factor",
                "memory_limit_bytes", "excessive_speedup_threshold",
                "cpu_threads", "poison_bytes", "gpu_flush_bytes", "cpu_flush_bytes")
# what a run step should have in force; the pool names any that is missing once (reads are open
# without landlock_read, unix sockets without seccomp, the host's processes without pidns, ...)
_EXPECTED_MEASURES = ("landlock_fs", "landlock_read", "pidns", "netns", "seccomp", "caps_dropped", "no_new_privs")
log = logging.getLogger("sandbox.pool")


def as_sandbox_config(cfg: Any) -> SandboxConfig:
    """A SandboxConfig from itself, or from a Hydra/OmegaConf node or a dict of the same keys."""
    if isinstance(cfg, SandboxConfig):
        return cfg
    from omegaconf import OmegaConf

    obj: SandboxConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SandboxConfig), cfg))  # type: ignore
    validate(obj)
    return obj


class SandboxPool:
    """``await pool.evaluate(ref_src, candidate_src, backend)`` -> :class:`SandboxResult`."""

    def __init__(self, cfg: SandboxConfig | Any, isolation_probe: IsolationProbe | None = None):
        """``isolation_probe``: what gates GPU run steps when ``gpu_isolation_probe`` is on (default:
        the CUDA probe of sandbox.gpu_probe; tests give one that gates CPU run steps)."""
        self.cfg = cfg = as_sandbox_config(cfg)
        self.isolation_probe = isolation_probe or IsolationProbe()
        self.probe_verdict: ProbeVerdict | None = None  # set once the probe has decided
        self._probe_lock = asyncio.Lock()
        self._own_cache = cfg.cache_dir is None
        self.cache = Path(cfg.cache_dir or tempfile.mkdtemp(prefix="sandbox_cache_"))
        for sub in ("builds", "pch", "work"):
            (self.cache / sub).mkdir(parents=True, exist_ok=True)
        self._narrow_header_dir = str(write_narrow_header(self.cache / "narrow_header"))
        self._slots = asyncio.Semaphore(cfg.max_concurrent)
        # task key -> (fastest reference time measured in this pool, how many steps measured it)
        self._ref: dict[str, tuple[float, int]] = {}
        self._ref_from: set[str] = set()  # the evaluations whose measured reference time is counted
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
        # the evaluations under way: token -> [stage, since] (stage: queued | build | run)
        self._in_flight: dict[int, list[Any]] = {}
        self._tokens = itertools.count()
        self._closed = False
        self._said_open = False
        self._launcher = Launcher(self.cache, self._narrow_header_dir)
        self._builds = BuildCache(cfg, self.cache, self._launcher, self._stats)

    # --- public -------------------------------------------------------------------------------

    async def evaluate(self, ref_src: str, candidate_src: str, backend: str | None = None,
                       key: str | None = None, **overrides: Any) -> SandboxResult:
        """Compile (cached), check and time ``candidate_src`` against ``ref_src``. Never raises for
        anything the candidate does; ``key`` labels the evaluation (work dir name, logs)."""
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        backend = backend or self.cfg.backend
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
        unknown = sorted(set(overrides) - set(_OVERRIDABLE))
        if unknown:
            raise TypeError(f"SandboxPool.evaluate: unknown override(s) {unknown}; allowed: {list(_OVERRIDABLE)}")
        cfg = dataclasses.replace(self.cfg, **overrides)
        token = next(self._tokens)
        self._in_flight[token] = ["queued", time.monotonic()]
        try:
            async with self._slots:
                t0 = time.monotonic()
                result = mark_refused_build(await self._evaluate(ref_src, candidate_src, backend, key, cfg, token))
                result.wall_s["total"] = round(time.monotonic() - t0, 3)
        finally:
            del self._in_flight[token]
        self._stats["evaluations"] += 1
        self._stats[f"error/{result.error_kind}" if result.error_kind else "error/none"] += 1
        self._stats["correct"] += int(result.correct)
        return result

    async def headers_ready(self) -> None:
        """Wait for the precompiled headers being built (benchmarks: measure the steady state)."""
        await self._builds.headers_ready()

    def in_flight(self) -> dict[str, float]:
        """The evaluations under way, by stage: ``queued`` (for one of max_concurrent slots),
        ``build`` (waiting for or in a compile step), ``run`` (waiting for the device or running:
        load, correctness, timing); ``oldest_s`` the age of the longest one, ``oldest_stage`` its
        stage's index in that order. What the loop's heartbeat shows of a step's reward tail."""
        now = time.monotonic()
        out = {stage: 0.0 for stage in IN_FLIGHT_STAGES}
        for stage, _ in self._in_flight.values():
            out[stage] += 1
        if self._in_flight:
            stage, since = min(self._in_flight.values(), key=lambda v: v[1])
            out.update(oldest_s=now - since, oldest_stage=float(IN_FLIGHT_STAGES.index(stage)))
        return out

    def _at(self, token: int | None, stage: str) -> None:
        if token in self._in_flight:
            self._in_flight[token][0] = stage

    def stats(self) -> dict[str, float]:
        minutes = max((time.monotonic() - self._started) / 60.0, 1e-9)
        out: dict[str, float] = {k: float(v) for k, v in self._stats.items()}
        out["evals_per_min"] = self._stats["evaluations"] / minutes
        if self._builds.compile_times:
            ts = sorted(self._builds.compile_times)
            out["compile_s_p50"] = statistics.median(ts)
            out["compile_s_p95"] = ts[min(len(ts) - 1, int(round(0.95 * (len(ts) - 1))))]
        out.setdefault("cache_hits", 0.0)
        return out

    async def aclose(self) -> None:
        self._closed = True
        await self._builds.aclose()
        for proc in list(self._launcher.live):
            kill_group(proc)
        self._launcher.zygotes.close()
        await self._builds.drain()
        if self._own_cache:
            await asyncio.to_thread(shutil.rmtree, self.cache, True)

    async def __aenter__(self) -> "SandboxPool":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # --- one evaluation -----------------------------------------------------------------------

    async def _evaluate(self, ref_src: str, cand_src: str, backend: str, key: str | None,
                        cfg: SandboxConfig, token: int | None = None) -> SandboxResult:
        gpus = await self._gpu_list() if backend in ("cuda", "triton") else []
        if backend == "cuda" and not gpus:
            return SandboxResult.failure("sandbox_error", "the cuda backend needs a GPU and none is visible",
                                      backend=backend)
        problem = devices.interpreter_problem() if backend == "triton" and not gpus else None
        if problem:  # the judge's environment, never the answer's fault
            return SandboxResult.failure("sandbox_error", problem, backend=backend)
        on_gpu = bool(gpus)
        arch = cfg.cuda_arch or (gpus[0][1] if gpus else "")
        bkey = build_key(cand_src, backend, arch, await self._torch(), await asyncio.to_thread(build_tools))
        eval_id = f"{_safe(key) + '-' if key else ''}{uuid.uuid4().hex[:10]}"
        eval_dir = self.cache / "work" / eval_id
        try:
            self._at(token, "build")
            compiled = await self._builds.ensure_built(bkey, cand_src, backend, arch, cfg, eval_dir)
            if compiled.get("error_kind"):
                res = SandboxResult.from_dict({**compiled, "backend": backend, "trials": cfg.correctness_trials})
                res.cache_hit = bool(compiled.get("cache_hit"))
                return res
            device_name = f"cuda:{arch}" if on_gpu else "cpu"
            # "p2": times of the second protocol (the judge's clock around each call); the timed calls
            # and threads are in the key because an evaluation may override them
            tkey = task_key(ref_src, f"p2:{backend}:{device_name}:{cfg.timing_runs}:{cfg.cpu_threads}")
            ref_ms = self._known_ref(tkey)
            self._at(token, "run")
            res = await self._run(ref_src, cand_src, backend, bkey, arch, cfg, eval_dir, eval_id, on_gpu, ref_ms,
                                  tkey)
            if res.timed and res.ref_runtime_ms and res.ref_runtime_spread is not None and res.error_kind is None:
                self._add_ref(tkey, eval_id, res.ref_runtime_ms)  # timed in this step
            self._ref_from.discard(eval_id)
            res.cache_hit = bool(compiled.get("cache_hit"))
            if "compile" in compiled.get("wall_s", {}) and not res.cache_hit:
                res.wall_s["compile"] = compiled["wall_s"]["compile"]
            return res
        finally:
            if not cfg.keep_workdirs:
                await asyncio.to_thread(shutil.rmtree, eval_dir, True)

    async def _run(self, ref_src: str, cand_src: str, backend: str, bkey: str, arch: str, cfg: SandboxConfig,
                   eval_dir: Path, eval_id: str, on_gpu: bool, ref_ms: float | None, tkey: str) -> SandboxResult:
        # a run step killed while torch held its build lock would stall every later load
        await asyncio.to_thread(remove_stale_batons, self.cache / "builds" / bkey, 120.0)
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

    async def _run_on(self, ref_src: str, cand_src: str, backend: str, bkey: str, arch: str, cfg: SandboxConfig,
                      eval_dir: Path, eval_id: str, on_gpu: bool, ref_ms: float | None, gate: DeviceGate | None,
                      gpu_index: int | None, tkey: str) -> SandboxResult:
        drop: tuple[str, ...] = ()
        if cfg.gpu_isolation_probe and self.isolation_probe.applies(backend, on_gpu):
            drop = (await self._probe(backend, gate, arch, cfg, eval_dir)).dropped
        timed = backend == "cpu" or on_gpu
        req = dict(mode="run", task_src=ref_src, candidate_src=cand_src, backend=backend,
                   device="cuda:0" if on_gpu else "cpu", correctness_trials=cfg.correctness_trials, seed=cfg.seed,
                   warmup_runs=cfg.warmup_runs, timing_runs=cfg.timing_runs, timing_budget_s=cfg.timing_budget_s,
                   timing_input_sets=cfg.timing_input_sets,
                   checked_share=cfg.checked_share,
                   tolerance={k: dataclasses.asdict(v) for k, v in cfg.tolerance.items()},
                   flush_bytes=cfg.gpu_flush_bytes if on_gpu else cfg.cpu_flush_bytes,
                   poison_bytes=cfg.poison_bytes, excessive_speedup_threshold=cfg.excessive_speedup_threshold,
                   cpu_threads=cfg.cpu_threads, ref_runtime_ms=None if cfg.reference_per_step else ref_ms,
                   timeout_s=run_limit(cfg, ref_ms),
                   call_limit_s=call_limit(cfg, ref_ms), call_timeout_floor_s=cfg.call_timeout_floor_s,
                   call_timeout_ref_factor=cfg.call_timeout_ref_factor, timed=timed, timing_probe=cfg.timing_probe)
        limit = req["timeout_s"] + max(30.0, req["timeout_s"])
        # a task's first GPU step runs alone and measures what later ones reserve; the host's slots
        # are counted, not measured
        need: int | None = self._footprints.get(tkey, -1) if on_gpu else 1  # -1: the judge's estimate
        # steps of a task launched before its reference time was known: the first to reach its timing
        # window times the reference, the others learn that time from the gate
        # (with reference_per_step each step times its own: the load beside it is the answer's load)
        ref_time = (lambda: self._known_ref(tkey), lambda ms: self._add_ref(tkey, eval_id, ms)) \
            if timed and not cfg.reference_per_step else None
        attempt = lost = 0
        while True:
            out = await self._launcher.step(req, "run", bkey, eval_dir / f"run{attempt}", eval_id, cfg, backend,
                                   None, arch, limit, drop, gate, visible=gpu_index, need=need,
                                   ref_time=ref_time)
            attempt += 1
            if out.data is None and out.killed_for is None:
                self._stats["lost_workers"] += 1
                lost += 1
                if lost <= cfg.lost_worker_retries:
                    continue
            if out.overlapped and need is not None and maybe_crowded(out):
                # a timeout or out-of-memory while others shared the device is never blamed on the
                # answer before it is seen alone
                self._stats["rerun_alone"] += 1
                need = None
                continue
            break
        if on_gpu and out.data is not None:  # each process's own peak: others on the device do not change it
            self._learn_footprint(tkey, out.data.get("task_profile"), cfg, gate.budget if gate is not None else 0)
        res = step_result(out, "run", cfg)
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

    def _device_gate(self, on_gpu: bool) -> DeviceGate | None:
        """With ``cpu_run_slots``, the host's gate: that many run steps share it for correctness, one
        holds it alone for timing; None: nothing."""
        if self.cfg.cpu_run_slots is None:
            return None
        if self._cpu_gate is None:
            self._cpu_gate = DeviceGate((None, "host"), self.cfg.cpu_run_slots, self.cfg.admission_overtake_s)
        return self._cpu_gate

    def _learn_footprint(self, tkey: str, profile: Any, cfg: SandboxConfig, budget: int = 0) -> None:
        """What a run step of this task reserves on its GPU, from a step that ran alone: the judge's
        peak (inputs, check set, outputs it holds), the reference runner's peak twice (the
        candidate is assumed alike; the NaN poison it frees first counted on top), and a CUDA context
        per process. One more than the gate's ``budget`` is admitted alone and still runs over
        ``gpu_memory_share``, into memory others on the GPU (an engine, a trainer) may need: said
        once."""
        if tkey in self._footprints or not isinstance(profile, dict):
            return
        judge, ref = profile.get("judge_peak_bytes"), profile.get("reference_peak_bytes")
        if not isinstance(judge, int) or not isinstance(ref, int):
            return
        need = judge + 2 * ref + cfg.poison_bytes + 3 * cfg.gpu_context_bytes
        self._footprints[tkey] = need
        if budget > 1 and need > budget:
            log.warning("sandbox: one evaluation of task %s holds %.1f GiB on its GPU, more than "
                        "sandbox.gpu_memory_share gives evaluations there (%.1f GiB): each runs alone, "
                        "and over the share", tkey[:40], need / 2**30, budget / 2**30)

    async def _probe(self, backend: str, gate: DeviceGate | None, arch: str, cfg: SandboxConfig,
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

    async def _probe_holding(self, backend: str, gpu: tuple[int, str] | None, arch: str, cfg: SandboxConfig,
                             eval_dir: Path) -> ProbeVerdict:
        async def run(dropped: tuple[str, ...]) -> tuple[bool, str, list[str] | None]:
            req = dict(mode="probe", probe_src=self.isolation_probe.src, backend=backend,
                       device="cuda:0" if gpu else "cpu", correctness_trials=0, cpu_threads=cfg.cpu_threads)
            workdir = eval_dir / f"probe-{'-'.join(dropped) or 'full'}"
            self._stats["isolation_probe_runs"] += 1
            out = await self._launcher.step(req, "probe", "isolation_probe", workdir, "isolation-probe", cfg,
                                   backend, gpu, arch, 120.0, dropped)
            if out.data is None:
                return False, f"probe worker lost ({out.killed_for or out.detail})", None
            err = out.data.get("error", "") + (f" | log: {out.data['log_tail'][-300:]}"
                                               if out.data.get("log_tail") else "")
            return bool(out.data.get("probe_ok")), err, list(out.data.get("isolation", []))

        self.probe_verdict = await choose_isolation(run)
        self._stats["isolation_dropped"] = len(self.probe_verdict.dropped)
        return self.probe_verdict

    # --- small helpers ------------------------------------------------------------------------

    async def _gpu_list(self) -> list[tuple[int, str]]:
        if self._gpus is None:
            found = await asyncio.to_thread(devices.detect_gpus)
            if self.cfg.gpu_ids:
                caps = dict(found)
                found = [(i, caps.get(i, "")) for i in self.cfg.gpu_ids]
            self._gpus = found
            sizes = devices.gpu_memory() if self.cfg.gpu_memory_share > 0 else {}  # one nvidia-smi for all
            for g in found:
                budget, warm = gpu_gate_budget(sizes.get(g[0], 0), self.cfg)
                self._gpu_gates[g[0]] = DeviceGate(g, budget, self.cfg.admission_overtake_s, warm,
                                                    self.cfg.gpu_max_steps)
        return self._gpus

    async def _torch(self) -> str:
        if self._torch_version is None:
            from importlib.metadata import version  # no torch import in the event loop's process

            self._torch_version = version("torch")
        return self._torch_version

    def _known_ref(self, tkey: str) -> float | None:
        """The task's reference time once ``reference_samples`` steps of this pool have timed it: the fastest
        of them (a load passing over the machine only ever makes a reference slower). Never read
        from disk: a time from another run (another load, another torch) would pair with none."""
        fastest, count = self._ref.get(tkey, (math.inf, 0))
        return fastest if count >= self.cfg.reference_samples else None

    def _add_ref(self, tkey: str, eval_id: str, ms: float) -> None:
        """A reference time a step measured (over the gate as its window ends, or in its result:
        counted once)."""
        if eval_id in self._ref_from or not (ms > 0 and math.isfinite(ms)):
            return
        self._ref_from.add(eval_id)
        fastest, count = self._ref.get(tkey, (math.inf, 0))
        self._ref[tkey] = (min(fastest, ms), count + 1)


def gpu_gate_budget(memory: int, cfg: SandboxConfig) -> tuple[int, int]:
    """A GPU gate's admission budget and warm slots: ``gpu_memory_share`` of the GPU's memory,
    less the room of the CUDA contexts (three a step) that the ``gpu_warm_steps`` steps at the head
    of its admission queue start before admission. Share 0 (or an unknown size): budget 1 and no
    warm slots, so every step is admitted alone (the whole GPU, exclusive from the start) and
    touches it only then."""
    room = int(memory * cfg.gpu_memory_share)
    warm = cfg.gpu_warm_steps if cfg.gpu_memory_share > 0 and memory > 0 else 0
    # where the share is small (a GPU shared with an engine and a trainer), warm contexts may take
    # at most half of it: the rest is for the footprints that admission counts
    warm = min(warm, room // (2 * 3 * cfg.gpu_context_bytes)) if warm else 0
    budget = room - warm * 3 * cfg.gpu_context_bytes
    return max(budget, 1), warm


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:40]

