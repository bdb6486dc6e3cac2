"""Which confinement each process of a step applies to itself (the measures are sandbox/isolation.py).

* the judge (and a compile or probe step's process) confines itself after the namespaces are made:
  reads and writes (Landlock), with writes to every existing /proc file allowed, since a Landlock
  rule binds to one process's /proc inode and the NVIDIA driver (570+) names the threads it starts
  by writing /proc/<pid>/task/<tid>/comm (cuInit fails with error 304 when it cannot);
* a runner, forked under the judge's layer, adds its own before any answer code is imported: the
  same reads, writes only to its work dir and its own /proc/<pid>/task, the signal and abstract
  socket scope, seccomp, no capabilities, its CPU set.

Layers intersect, so a runner can write its own threads' files and nothing else in /proc, while
the judge, whose domain encloses the runners', can still read what they leave behind and kill it.
"""
from __future__ import annotations

import os
from pathlib import Path

from sandbox import isolation, privileges, read_roots as roots, seccomp
from sandbox.wire import StepRequest

_SANDBOX_PKG = str(Path(__file__).resolve().parent)


def read_roots(req: StepRequest) -> list[str]:
    extra = [req.workdir, req.build_dir, _SANDBOX_PKG, *req.read_roots]
    extra += [p for p in (req.pch_root, req.narrow_header_dir, req.split_root) if p]
    return roots.default_read_roots(extra)


def _landlock(req: StepRequest, write_roots: list[str], proc_dir: str, scope: bool) -> list[str]:
    iso = req.isolation
    drop = set(iso.drop)
    if not iso.writes or "landlock" in drop:
        return []
    devices = roots.default_device_paths()
    if "landlock_read" in drop:  # the probe found the device needs more than the read rules give
        return isolation.restrict_writes(write_roots, devices + [proc_dir], block_tcp=iso.network, scope=scope)
    return isolation.restrict_access(read_roots(req), write_roots, devices, block_tcp=iso.network, scope=scope,
                                     proc_dir=proc_dir)


def confine_judge(req: StepRequest, scope: bool) -> list[str]:
    """Landlock for the judge (``scope``: also for a compile or probe step, which run answer or
    probe code themselves)."""
    drop = set(req.isolation.drop)
    return _landlock(req, [req.workdir, req.build_dir, "/dev/shm"], "/proc",
                     scope=scope and "landlock_scope" not in drop)


def confine_runner(req: StepRequest, workdir: str) -> list[str]:
    """The runner's own layer and its privileges, in the order the kernel needs: Landlock, then the
    capabilities and CPU set, then seccomp (which denies changing the CPU set afterwards)."""
    drop = set(req.isolation.drop)
    applied = _landlock(req, [workdir, req.build_dir, "/dev/shm"], f"/proc/{os.getpid()}/task",
                        scope="landlock_scope" not in drop)
    if "privileges" not in drop:
        applied += privileges.drop_privileges(req.isolation.cpus or None)
    if "seccomp" not in drop:
        applied += seccomp.install_filter()
    return applied
