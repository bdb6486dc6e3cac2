"""The pool's build cache: compile steps by content hash (a repeated or concurrent identical answer
never rebuilds: a future per key in this pool, a file lock across pools), and the precompiled
headers the trusted pool builds for flag sets that builds keep asking for (docs/sandbox.md,
"Compile cost"). The pool owns one; compile steps run through sandbox/launch.py.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sandbox.build import pch_allowed
from sandbox.config import SandboxConfig
from sandbox.launch import PROJECT_ROOT, Launcher, over_quota, release_transport, scrubbed_env, step_result

# Compile verdicts that depend only on the source: cached with the build.
CACHEABLE_FAILURES = ("compile_error", "load_error")


class BuildCache:
    """``await ensure_built(...)``: the compile verdict of an answer, from the cache or a compile step."""

    def __init__(self, cfg: SandboxConfig, cache: Path, launcher: Launcher, stats: Counter[str]):
        self.cfg, self.cache, self.launcher, self.stats = cfg, cache, launcher, stats
        self.compile_slots = asyncio.Semaphore(cfg.compile_workers)
        self.building: dict[str, asyncio.Task] = {}
        self.pch_building: dict[str, asyncio.Task] = {}
        self._pch_requests: Counter[str] = Counter()
        self._split_requests: Counter[str] = Counter()
        self.compile_times: list[float] = []
        self.closed = False
        self.remote = None  # sandbox/build_pool.py: compile steps on the Ray cluster's nodes
        if cfg.build_pool == "ray":
            from sandbox.build_pool import RemoteBuilds  # Ray is imported only for this pool

            self.remote = RemoteBuilds(cfg, cache, stats)

    async def headers_ready(self) -> None:
        """Wait for the precompiled headers being built, and with a Ray build pool for its actors to
        start (benchmarks: measure the steady state)."""
        if self.remote is not None:
            await self.remote.ready()
        await asyncio.gather(*self.pch_building.values(), return_exceptions=True)

    async def aclose(self) -> None:
        self.closed = True
        if self.remote is not None:
            self.remote.close()
        for task in list(self.building.values()) + list(self.pch_building.values()):
            task.cancel()

    async def drain(self) -> None:
        await asyncio.gather(*self.building.values(), *self.pch_building.values(), return_exceptions=True)

    async def ensure_built(self, bkey: str, cand_src: str, backend: str, arch: str, cfg: SandboxConfig,
                            eval_dir: Path) -> dict[str, Any]:
        """The compile verdict for ``bkey``: from the cache, from a build in flight, or by building."""
        marker = self.cache / "builds" / f"{bkey}.json"
        if marker.exists():
            self.stats["cache_hits"] += 1
            return {**json.loads(marker.read_text()), "cache_hit": True}
        if not needs_compile_step(cand_src):
            return {"stage": "compile"}
        task = self.building.get(bkey)
        if task is not None:
            self.stats["deduplicated_builds"] += 1
            verdict = await asyncio.shield(task)
            return {**verdict, "cache_hit": True}
        task = asyncio.ensure_future(self._build(bkey, cand_src, backend, arch, cfg, eval_dir, marker))
        self.building[bkey] = task
        task.add_done_callback(lambda _t: self.building.pop(bkey, None))
        return await asyncio.shield(task)

    async def _build(self, bkey: str, cand_src: str, backend: str, arch: str, cfg: SandboxConfig,
                     eval_dir: Path, marker: Path) -> dict[str, Any]:
        # with a Ray build pool the compile step runs on a node of the cluster (its slots, not this
        # host's); a build no node could make (lost, refused) is made here, in this host's slots
        slots = self.remote.slots if self.remote is not None else self.compile_slots
        async with slots:
            lock_fd = await self._lock(self.cache / "builds" / f"{bkey}.lock")
            try:
                if marker.exists():  # another pool built it while we waited
                    self.stats["cache_hits"] += 1
                    return {**json.loads(marker.read_text()), "cache_hit": True}
                remove_stale_batons(self.cache / "builds" / bkey, older_than_s=0.0)
                verdict, wanted = None, {}
                if self.remote is not None:
                    verdict = await self.remote.build(bkey, cand_src, backend, arch, cfg)
                    if verdict is None:
                        self.stats["remote_builds_made_here"] += 1
                        async with self.compile_slots:
                            verdict, wanted = await compile_step(self.launcher, self.cache, bkey, cand_src,
                                                                 backend, arch, cfg, eval_dir)
                else:
                    verdict, wanted = await compile_step(self.launcher, self.cache, bkey, cand_src, backend, arch,
                                                         cfg, eval_dir)
                kind = verdict.get("error_kind")
                if kind is None:
                    self.compile_times.append(verdict["wall_s"]["compile"])
                    self.stats["compiles"] += 1
                if kind is None or kind in CACHEABLE_FAILURES:
                    marker.write_text(json.dumps(verdict))
                for flags in wanted.get("pch_wanted", []):
                    self.schedule_pch(flags)
                for flags in wanted.get("split_wanted", []):
                    self.schedule_split(flags)
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

    def schedule_pch(self, flags: list[str]) -> None:
        if not self.cfg.precompiled_header or self.closed or not pch_allowed(flags):
            return
        k = json.dumps(flags)
        self._pch_requests[k] += 1
        existing = sum(1 for p in (self.cache / "pch").iterdir() if not p.name.startswith("."))
        if (k in self.pch_building or self._pch_requests[k] < self.cfg.pch_min_builds
                or existing + sum(not b.startswith("split:") for b in self.pch_building) >= self.cfg.pch_max_sets):
            return
        self.pch_building[k] = asyncio.ensure_future(self._build_pch(flags))

    def schedule_split(self, flags: list[str]) -> None:
        """The split build's trusted parts for a flag set (sandbox/split_build.py), once as many
        builds asked for them as a PCH needs; tracked with the PCHs (headers_ready waits for both)."""
        if not self.cfg.split_build or self.closed or not pch_allowed(flags):
            return
        k = "split:" + json.dumps(flags)
        self._split_requests[k] += 1
        if k in self.pch_building or self._split_requests[k] < self.cfg.pch_min_builds:
            return
        self.pch_building[k] = asyncio.ensure_future(
            self._build_trusted(["sandbox.split_build", "--root", str(self.cache / "split")], flags, "split"))

    async def _build_pch(self, flags: list[str]) -> None:
        await self._build_trusted(["sandbox.build", "--pch-root", str(self.cache / "pch")], flags, "pch")

    async def _build_trusted(self, module_args: list[str], flags: list[str], what: str) -> None:
        """Trusted (unsandboxed) build of precompiled headers or the split build's library for one
        flag set, off the critical path."""
        async with self.compile_slots:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", *module_args,
                "--cflags", json.dumps(flags), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=scrubbed_env({"PYTHONPATH": PROJECT_ROOT, "HOME": str(self.cache)}), start_new_session=True)
            self.launcher.live.add(proc)
            try:
                out, err = await proc.communicate()
                self.stats[f"{what}_built" if proc.returncode == 0 else f"{what}_failed"] += 1
            finally:
                self.launcher.live.discard(proc)
                release_transport(proc)


async def compile_step(launcher: Launcher, cache: Path, bkey: str, cand_src: str, backend: str, arch: str,
                       cfg: SandboxConfig, eval_dir: Path) -> tuple[dict[str, Any], dict[str, list[list[str]]]]:
    """One compile step into ``<cache>/builds/<bkey>``: its verdict (a build over the quota is
    removed and is the answer's compile_error) and the flag sets it asked PCHs and split builds for
    (already re-checked: the answer ran in that process and could forge the report)."""
    req = dict(mode="compile", candidate_src=cand_src, backend=backend, device="cpu",
               correctness_trials=cfg.correctness_trials, cpu_threads=cfg.cpu_threads)
    t = time.monotonic()
    out = await launcher.step(req, "compile", bkey, eval_dir / "compile", bkey[:10], cfg, backend, None, arch,
                              cfg.compile_timeout_s)
    res = step_result(out, "compile", cfg)
    verdict = {k: v for k, v in res.to_dict().items() if k in ("stage", "compiled", "error_kind", "error", "log_tail")}
    verdict["wall_s"] = {"compile": round(time.monotonic() - t, 3)}
    if res.error_kind is None:
        over = await asyncio.to_thread(over_quota, cache / "builds" / bkey, cfg)
        if over:  # files the answer's build left behind beyond what any build needs
            await asyncio.to_thread(shutil.rmtree, cache / "builds" / bkey, True)
            verdict.update(compiled=False, error_kind="compile_error", error=over)
    wanted: dict[str, list[list[str]]] = {}
    for name in ("pch_wanted", "split_wanted"):
        got = (out.data or {}).get(name, [])
        wanted[name] = [flags for flags in (got if isinstance(got, list) else [])
                        if isinstance(flags, list) and all(isinstance(f, str) for f in flags) and pch_allowed(flags)]
    return verdict, wanted


def needs_compile_step(src: str) -> bool:
    # Only C++/CUDA builds are worth a process of their own; Triton compiles at first call.
    return "cpp_extension" in src or "load_inline" in src


def remove_stale_batons(build_dir: Path, older_than_s: float) -> None:
    """torch's FileBaton ('<ext>/lock') survives a killed build and makes the next one wait forever."""
    now = time.time()
    for lock in build_dir.glob("*/lock"):
        try:
            if now - lock.stat().st_mtime >= older_than_s:
                lock.unlink()
        except OSError:
            continue
