"""Dropping what a root-started worker could use against the host: capabilities, realtime and
nice priority, CPUs beyond its share, privilege gain through execve.

The worker starts as root (or with capabilities in a user namespace). Without this, a candidate
could raise itself to SCHED_FIFO and starve the host's other evaluations, widen its CPU affinity,
mknod device nodes, load modules, change the hostname, read every file (CAP_DAC_OVERRIDE)...
Capabilities, no_new_privs and affinity are per thread: call while the process has one thread.
Only the standard library: this runs before torch is imported.
"""
from __future__ import annotations

import ctypes
import os
import resource

_PR_CAPBSET_READ, _PR_CAPBSET_DROP = 23, 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS, _PR_GET_NO_NEW_PRIVS = 38, 39
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522  # two 32-bit data structs: capabilities 0..63

# securebits (linux/securebits.h): root gains nothing by being uid 0 or by execve (NOROOT), no caps
# fix-up on uid changes, KEEP_CAPS off, no ambient raising; each locked so it cannot be undone
_SECBIT_NOROOT, _SECBIT_NOROOT_LOCKED = 1 << 0, 1 << 1
_SECBIT_NO_SETUID_FIXUP, _SECBIT_NO_SETUID_FIXUP_LOCKED = 1 << 2, 1 << 3
_SECBIT_KEEP_CAPS_LOCKED = 1 << 5
_SECBIT_NO_CAP_AMBIENT_RAISE, _SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED = 1 << 6, 1 << 7
_SECBITS = _SECBIT_NOROOT | _SECBIT_NO_SETUID_FIXUP | _SECBIT_NO_CAP_AMBIENT_RAISE
_SECBITS_LOCKED = (_SECBITS | _SECBIT_NOROOT_LOCKED | _SECBIT_NO_SETUID_FIXUP_LOCKED | _SECBIT_KEEP_CAPS_LOCKED
                   | _SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED)

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_privileges(cpus: list[int] | None = None) -> list[str]:
    """Returns what applied: ``cpu_affinity`` (every thread on ``cpus``, when given; threads made
    later inherit it), ``rlimit_rtprio`` (no realtime scheduling) and ``rlimit_nice`` (no raising
    of priority: a ceiling of 20 - 0 = nice 20, so any lowering of the nice value fails),
    ``caps_dropped`` (ambient cleared, bounding set emptied, securebits locked, capset to zero;
    recorded only if CapEff, CapPrm and CapBnd then read zero: no execve of any binary brings
    capabilities back) and ``no_new_privs`` (no setuid/file-capability gain). Works before or
    after Landlock; must precede seccomp.install_filter, which denies sched_setaffinity."""
    applied = []
    if cpus and _set_affinity(cpus):
        applied.append("cpu_affinity")
    for name, limit in (("rlimit_rtprio", resource.RLIMIT_RTPRIO), ("rlimit_nice", resource.RLIMIT_NICE)):
        try:
            resource.setrlimit(limit, (0, 0))  # lowering a hard limit needs no privilege
            applied.append(name)
        except (ValueError, OSError):
            pass
    if _drop_caps():
        applied.append("caps_dropped")
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 and _libc.prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1:
        applied.append("no_new_privs")
    return applied


def _set_affinity(cpus: list[int]) -> bool:
    wanted = set(cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    try:
        for tid in tids:
            try:
                os.sched_setaffinity(tid, wanted)
            except ProcessLookupError:  # a thread that has exited meanwhile
                continue
        return bool(os.sched_getaffinity(0)) and os.sched_getaffinity(0) <= wanted
    except OSError:
        return False


def _cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        last = 0
        while last < 63 and _libc.prctl(_PR_CAPBSET_READ, last + 1, 0, 0, 0) >= 0:
            last += 1
        return last


def _drop_caps() -> bool:
    last = _cap_last_cap()
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    # the bounding set and the securebits need CAP_SETPCAP: before capset takes it away
    for cap in range(last + 1):
        _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    if _libc.prctl(_PR_SET_SECUREBITS, _SECBITS_LOCKED, 0, 0, 0) != 0:
        _libc.prctl(_PR_SET_SECUREBITS, _SECBITS, 0, 0, 0)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _libc.capset(ctypes.byref(header), data)
    return _caps_zero(last)


def _caps_zero(last: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            caps = {k: int(v, 16) for k, _, v in (ln.partition(":") for ln in f) if k in ("CapEff", "CapPrm", "CapBnd")}
        if len(caps) == 3:
            return not any(caps.values())
    except (OSError, ValueError):
        pass
    # no /proc: ask the kernel directly
    header, data = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        return False
    if any(d.effective or d.permitted for d in data):
        return False
    return all(_libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0) == 0 for cap in range(last + 1))
