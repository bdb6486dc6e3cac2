"""Compile steps on the Ray cluster's nodes (``sandbox.build_pool: ray``).

A cold build costs a core for 2-30 s (C++) or ~25 s (CUDA) and every sampled answer is a new one,
so the host that times kernels runs out of cores for builds long before its GPUs run out of work.
With this pool the compile step of :class:`sandbox.build_cache.BuildCache` runs on a build actor
(``ray_build_workers`` of them, ``ray_build_cpus`` Ray CPUs each, spread over the nodes that offer
``ray_build_resource``). The actor starts ``python -m sandbox.build_pool`` on its node, which runs
the same confined compile worker (``Launcher.step``, mode "compile") under that node's cache dir
and packs ``<cache>/builds/<bkey>/``; the pool checks the pack against the quota, unpacks it
beside the local build dir and renames it into place, and only then writes the verdict marker, so
the run step loads it as a local build.

The build dir must have the same path on both ends: torch's build.ninja names its sources by
absolute path, and a build made elsewhere would look dirty to the run step's ninja and be rebuilt.
So a node builds under ``sandbox.cache_dir`` on its own disk, or, with ``ray_build_node_dir``, in
a dir of its own bound at ``cache_dir`` in a private mount namespace (nodes sharing a filesystem).

A node whose build key would differ (another torch, Python, recipe or compiler) is refused at
start, naming it and what differs: its builds would never match this pool's keys. Each build
checks its key again there. A lost node or actor, a refused or failed hand-over is never the
answer's: the caller builds it here (once). The PCH and split build are off on remote nodes: their
trusted parts live in each node's cache, and a build that uses them would need them at the same
path on this node.
"""
from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import io
import json
import logging
import os
import shutil
import sys
import tarfile
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from sandbox.build import BUILD_RECIPE, build_key, build_tools, write_narrow_header
from sandbox.config import SandboxConfig

log = logging.getLogger("sandbox.build_pool")
START_TIMEOUT_S = 120.0   # build actors not placed by then (no node offers the resource) are dropped
HANDOVER_MARGIN_S = 120.0  # beyond compile_timeout_s: the node's own limit ends the step first
_MS_BIND, _MS_REC, _MS_PRIVATE, _CLONE_NEWNS = 4096, 16384, 1 << 18, 0x00020000


def key_parts() -> dict[str, str]:
    """What a build key holds besides the answer (sandbox.build.build_key), as this process sees it."""
    from importlib.metadata import version  # no torch import

    return {"torch": version("torch"), "python": sys.version, "build recipe": BUILD_RECIPE,
            "build tools": build_tools()}


def key_difference(ours: dict[str, str], theirs: dict[str, str]) -> str:
    return "; ".join(f"{k} {theirs.get(k)!r} there, {v!r} here" for k, v in ours.items() if theirs.get(k) != v)


class RemoteBuilds:
    """The pool's build actors: ``await build(...)`` -> the verdict of a build made on a node and
    unpacked into this cache, or None when no node made it (the caller builds it here)."""

    def __init__(self, cfg: SandboxConfig, cache: Path, stats: Counter[str]):
        self.cfg, self.cache, self.stats = cfg, cache, stats
        self.slots = asyncio.Semaphore(cfg.ray_build_workers)
        self.refusals: list[str] = []      # one line per refused node, for people
        self._idle: asyncio.Queue[Any] = asyncio.Queue()
        self._actors: list[Any] = []
        self._started: asyncio.Task | None = None

    async def ready(self) -> None:
        """The build actors started, probed, and those whose key differs refused (once)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def build(self, bkey: str, cand_src: str, backend: str, arch: str, cfg: SandboxConfig) -> dict | None:
        await self.ready()
        if not self._actors:
            return None
        actor = await self._idle.get()
        if actor is None:  # the last actor went while this build waited
            self._idle.put_nowait(None)
            return None
        job = dict(bkey=bkey, cand_src=cand_src, backend=backend, arch=arch, cache=str(self.cache),
                   node_dir=cfg.ray_build_node_dir, cfg=dataclasses.asdict(cfg))
        try:
            got = await asyncio.wait_for(actor.build.remote(job), cfg.compile_timeout_s + HANDOVER_MARGIN_S)
        except Exception as exc:  # the node, its actor or the call is gone: never the answer's fault
            self._drop(actor, f"lost while building {bkey[:10]} ({type(exc).__name__}: {str(exc)[:300]})")
            self.stats["remote_builds_lost"] += 1
            return None
        if got.get("refused"):
            self._drop(actor, got["refused"])
            return None
        self._idle.put_nowait(actor)
        verdict = got["verdict"]
        if got.get("tar") is not None:
            try:
                problem = await asyncio.to_thread(unpack_build, got["tar"], self.cache, bkey, cfg,
                                                  got.get("mtimes", {}))
            except (OSError, tarfile.TarError) as exc:  # this host's disk, a torn pack: built here instead
                log.warning("sandbox: the build of %s from node %s could not be put in place (%s); it is built here",
                            bkey[:10], got["node"], exc)
                self.stats["remote_builds_lost"] += 1
                return None
            if problem:  # the answer's build holds what no build dir may (a link out of it, too much)
                verdict.update(compiled=False, error_kind="compile_error", error=problem)
        verdict["build_node"] = got["node"]
        self.stats[f"built_on/{got['node']}"] += 1
        return verdict

    def close(self) -> None:
        if self._started is not None:
            self._started.cancel()
        for actor in self._actors:
            _kill(actor)
        self._actors.clear()

    async def _start(self) -> None:
        try:
            await self._start_actors()
        except Exception as exc:  # builds still run (here): an evaluation never fails for the pool's sake
            log.error("sandbox: sandbox.build_pool=ray could not start its build actors (%s); every build runs here",
                      exc)
            self.refusals.append(f"no build actors: {exc}")

    async def _start_actors(self) -> None:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("Ray is not started in this process (ray.init first)")
        cfg = self.cfg
        opts: dict[str, Any] = dict(num_cpus=cfg.ray_build_cpus, scheduling_strategy="SPREAD", max_restarts=0)
        if cfg.ray_build_resource:
            opts["resources"] = {cfg.ray_build_resource: 1}
        node_cls = ray.remote(BuildNode).options(**opts)
        actors = [node_cls.remote() for _ in range(cfg.ray_build_workers)]
        ours = await asyncio.to_thread(key_parts)
        probes = {asyncio.ensure_future(_awaited(a.probe.remote())): a for a in actors}
        done, pending = await asyncio.wait(probes, timeout=START_TIMEOUT_S)
        for fut in pending:
            fut.cancel()
            self._refuse(probes[fut], f"a build actor was not placed within {START_TIMEOUT_S:g} s (no node offers "
                         f"{opts.get('resources') or 'the CPUs'} free: sandbox.ray_build_resource / ray_build_cpus)")
        for fut in done:
            actor = probes[fut]
            if fut.exception() is not None:
                self._refuse(actor, f"a build actor failed to start: {fut.exception()}")
                continue
            info = fut.result()
            diff = key_difference(ours, info["parts"])
            if diff:
                self._refuse(actor, f"node {info['node']} ({info['host']}) is refused for builds: its build key "
                                    f"would differ ({diff})")
                continue
            self._actors.append(actor)
            self._idle.put_nowait(actor)
        self.stats["build_actors"] = len(self._actors)
        if not self._actors:
            log.warning("sandbox: no node takes builds (sandbox.build_pool=ray); every build runs here")

    def _refuse(self, actor: Any, why: str) -> None:
        log.warning("sandbox: %s", why)
        self.refusals.append(why)
        self.stats["build_nodes_refused"] += 1
        _kill(actor)

    def _drop(self, actor: Any, why: str) -> None:
        log.warning("sandbox: build actor dropped, its build runs here: %s", why)
        self.refusals.append(why)
        if actor in self._actors:
            self._actors.remove(actor)
        _kill(actor)
        if not self._actors:
            self._idle.put_nowait(None)  # wakes builds waiting for an actor: none is coming


class BuildNode:
    """A build actor (``ray.remote`` is applied by RemoteBuilds): one compile step at a time, each
    in a fresh ``python -m sandbox.build_pool`` on this node."""

    def probe(self) -> dict[str, Any]:
        import socket

        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "parts": key_parts()}

    async def build(self, job: dict[str, Any]) -> dict[str, Any]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        if job.get("node_dir"):
            job["node_dir"] = job["node_dir"].replace("{node}", node)
        fd, tar_path = tempfile.mkstemp(prefix="sandbox_build_", suffix=".tar")
        os.close(fd)
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sandbox.build_pool", tar_path, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
            out, err = await proc.communicate(json.dumps(job).encode())
            lines = out.decode("utf-8", "replace").strip().splitlines()
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"the build process on node {node} ended with {proc.returncode}: "
                                   f"{err.decode('utf-8', 'replace')[-1500:]}")
            got = json.loads(lines[-1])
            got["node"] = node
            if got.get("refused"):
                got["refused"] = f"node {node}: {got['refused']}"
            got["tar"] = Path(tar_path).read_bytes() if got.pop("packed", False) else None
            return got
        finally:
            os.unlink(tar_path)


async def _awaited(ref: Any) -> Any:
    return await ref


def _kill(actor: Any) -> None:
    try:
        import ray

        ray.kill(actor, no_restart=True)
    except Exception:  # already gone with its node
        pass


def unpack_build(tar_bytes: bytes, cache: Path, bkey: str, cfg: SandboxConfig,
                 mtimes: dict[str, int]) -> str | None:
    """Put a build made on another node at ``<cache>/builds/<bkey>`` (beside it first, then one
    rename, so a run step never sees half of it); the answer's problem, or None."""
    builds = cache / "builds"
    incoming = builds / f".{bkey}.incoming-{uuid.uuid4().hex[:8]}"
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        members = tar.getmembers()
        size, files = sum(m.size for m in members if m.isfile()), sum(1 for m in members if not m.isdir())
        if size > cfg.max_build_dir_bytes or files > cfg.max_build_dir_files:
            return (f"the build left {files} files, {size / 2**20:.0f} MiB in its build dir, over the quota "
                    f"({cfg.max_build_dir_files} files, {cfg.max_build_dir_bytes / 2**20:.0f} MiB)")
        try:
            tar.extractall(incoming, filter="data")  # no absolute paths, no links out, no devices
        except tarfile.FilterError as exc:
            shutil.rmtree(incoming, ignore_errors=True)
            return f"the build dir holds what no build may leave: {exc}"
    for rel, ns in mtimes.items():  # exact, as ninja recorded them (the tar's floats are not)
        path = incoming / rel
        if path.resolve().is_relative_to(incoming.resolve()) and os.path.lexists(path):
            os.utime(path, ns=(ns, ns), follow_symlinks=False)
    final = builds / bkey
    if final.exists():  # what a lost local attempt or the step's own mkdir left: never a finished build
        old = builds / f".{bkey}.old-{uuid.uuid4().hex[:8]}"
        final.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    incoming.rename(final)
    return None


# --- the build process on a node (python -m sandbox.build_pool TAR_PATH, the job on stdin) ---------

def _bind_node_dir(node_dir: str, cache: str) -> None:
    """``node_dir`` at ``cache`` in a mount namespace of this process alone."""
    os.makedirs(node_dir, exist_ok=True)
    os.makedirs(cache, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0 \
            or libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0 \
            or libc.mount(node_dir.encode(), cache.encode(), None, ctypes.c_ulong(_MS_BIND | _MS_REC), None) != 0:
        raise OSError(ctypes.get_errno(), f"cannot bind sandbox.ray_build_node_dir {node_dir} at the cache dir "
                                          f"{cache} (needs root or user namespaces)")


async def _build_here(job: dict[str, Any], tar_path: str) -> dict[str, Any]:
    import fcntl

    from omegaconf import OmegaConf

    from sandbox.build_cache import compile_step
    from sandbox.launch import Launcher

    cfg: SandboxConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SandboxConfig), job["cfg"]))
    cfg = dataclasses.replace(cfg, cache_dir=job["cache"], precompiled_header=False, split_build=False)
    bkey, cache = job["bkey"], Path(job["cache"])
    parts = key_parts()
    mine = build_key(job["cand_src"], job["backend"], job["arch"], parts["torch"], parts["build tools"])
    if mine != bkey:
        return {"refused": f"its build key for this answer differs ({mine} here, {bkey} asked): {parts}"}
    for sub in ("builds", "work"):
        (cache / sub).mkdir(parents=True, exist_ok=True)
    # a lock of its own name: the pool that asked may hold <bkey>.lock on this same disk
    lock = os.open(cache / "builds" / f"{bkey}.node-lock", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    launcher = Launcher(cache, str(write_narrow_header(cache / "narrow_header")))
    eval_dir = cache / "work" / f"{bkey[:10]}-node-{uuid.uuid4().hex[:8]}"
    try:
        verdict, _wanted = await compile_step(launcher, cache, bkey, job["cand_src"], job["backend"], job["arch"],
                                              cfg, eval_dir)
        packed = verdict.get("error_kind") is None
        mtimes: dict[str, int] = {}
        if packed:
            with tarfile.open(tar_path, "w") as tar:
                tar.add(cache / "builds" / bkey, arcname=".")
            mtimes = _mtimes(cache / "builds" / bkey)
        return {"verdict": verdict, "packed": packed, "mtimes": mtimes}
    finally:
        launcher.zygotes.close()
        shutil.rmtree(eval_dir, ignore_errors=True)
        os.close(lock)


def _mtimes(root: Path) -> dict[str, int]:
    """Each file's mtime in ns: a tar keeps them as floats, and ninja reads a deps record as stale
    when its output's mtime comes back a fraction of a microsecond later than it recorded."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.lstat(path).st_mtime_ns
    return out


def main() -> int:
    job = json.loads(sys.stdin.read())
    try:
        if job.get("node_dir"):
            _bind_node_dir(job["node_dir"], job["cache"])
    except OSError as exc:
        print(json.dumps({"refused": str(exc)}))
        return 0
    print(json.dumps(asyncio.run(_build_here(job, sys.argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
