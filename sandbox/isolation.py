"""OS-level confinement of one worker process: resource limits, namespaces, Landlock.

Each measure is tried and recorded; where the kernel or the privileges do not allow one, the
worker goes on without it and the result says which measures were in force (``isolation``).
Only the standard library: this runs before torch is imported.
"""
from __future__ import annotations

import ctypes
import errno
import os
import resource
from pathlib import Path

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000

_SYS_landlock_create_ruleset, _SYS_landlock_add_rule, _SYS_landlock_restrict_self = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

# Landlock filesystem rights (linux/landlock.h)
_FS_WRITE_FILE = 1 << 1
_FS_REMOVE_DIR, _FS_REMOVE_FILE = 1 << 4, 1 << 5
_FS_MAKE_CHAR, _FS_MAKE_DIR, _FS_MAKE_REG, _FS_MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
_FS_MAKE_FIFO, _FS_MAKE_BLOCK, _FS_MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def set_rlimits(memory_bytes: int | None, open_files: int, processes: int, cpu_s: int,
                file_size_bytes: int) -> list[str]:
    """Apply the limits; returns the names of those in force."""
    applied = []
    wanted = [("RLIMIT_NOFILE", open_files), ("RLIMIT_CPU", cpu_s), ("RLIMIT_FSIZE", file_size_bytes)]
    if memory_bytes:
        wanted.append(("RLIMIT_AS", memory_bytes))
    # root ignores RLIMIT_NPROC; elsewhere it counts every process of the user, so add those.
    if os.geteuid() != 0 and processes > 0:
        wanted.append(("RLIMIT_NPROC", _processes_of_user() + processes))
    for name, value in wanted:
        limit = getattr(resource, name)
        try:
            _, hard = resource.getrlimit(limit)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (value, value if name != "RLIMIT_NOFILE" else max(value, 0)))
            applied.append(name.lower())
        except (ValueError, OSError):
            continue
    return applied


def _processes_of_user() -> int:
    uid, count = os.getuid(), 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid and len(os.listdir(entry / "task"))
            except OSError:
                continue
    return count


def unshare_namespaces(network: bool, pids: bool, mounts: bool | None = None) -> list[str]:
    """New network, PID and mount namespaces (as root, or through a user namespace). Returns what
    was made. ``mounts`` defaults to ``pids``: the mount namespace is there so the PID namespace's
    first child can mount its own /proc (:func:`mount_private_proc`), hiding the host's processes
    and their environments.
    """
    mounts = pids if mounts is None else mounts
    flags = (_CLONE_NEWNET if network else 0) | (_CLONE_NEWPID if pids else 0) | (_CLONE_NEWNS if mounts else 0)
    if not flags:
        return []
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(flags) != 0:
        if ctypes.get_errno() != errno.EPERM or _libc.unshare(flags | _CLONE_NEWUSER) != 0:
            return []
        _map_own_ids(uid, gid)
    made = []
    if network:
        made.append("netns")
    if pids:
        made.append("pidns")
    if mounts:
        made.append("mountns")
    return made


_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 1 << 14, 1 << 18
# Parts of the old /proc carried over into the private one. A container runtime curates the GPU
# driver's view (/proc/driver/nvidia: only this container's GPUs, "ModifyDeviceFiles: 0"); a fresh
# procfs shows the host's instead, and the CUDA driver may then try to create device files it is
# not allowed to (Landlock forbids mknod) and fail to initialise.
KEPT_PROC_PATHS = ("/proc/driver/nvidia",)


def mount_private_proc(keep: tuple[str, ...] = KEPT_PROC_PATHS) -> list[str]:
    """In the PID namespace's first process: a /proc that shows only this namespace, with the
    old view of ``keep`` bound over it (``kept_proc_view`` in the result when one was)."""
    if _libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        return []
    # O_PATH descriptors into the old /proc: once the new one covers it, /proc/self/fd/N still
    # leads to the old tree, which is what the bind mount below takes.
    old = {p: os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in keep if os.path.isdir(p)}
    try:
        if _libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC), None) != 0:
            return []
        applied = ["private_proc"]
        for path, fd in old.items():
            if os.path.isdir(path) and _libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None,
                                                   ctypes.c_ulong(_MS_BIND | _MS_REC), None) == 0:
                applied.append("kept_proc_view")
        return sorted(set(applied))
    finally:
        for fd in old.values():
            os.close(fd)


def _map_own_ids(uid: int, gid: int) -> None:
    # A process whose uid is unmapped cannot create files: map our ids onto themselves.
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError:
        pass


def landlock_abi() -> int:
    r = _libc.syscall(_SYS_landlock_create_ruleset, None, ctypes.c_size_t(0),
                      ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return int(r) if r > 0 else 0


def restrict_writes(writable: list[str], device_dirs: list[str], block_tcp: bool, scope: bool = True) -> list[str]:
    """Landlock: writes only beneath ``writable`` (and to existing files under ``device_dirs``);
    no TCP bind/connect when ``block_tcp``; with ``scope``, no signals to and no abstract unix
    sockets of processes outside. Returns what applied."""
    abi = landlock_abi()
    if abi < 1:
        return []
    creating = (_FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_CHAR | _FS_MAKE_DIR | _FS_MAKE_REG
                | _FS_MAKE_SOCK | _FS_MAKE_FIFO | _FS_MAKE_BLOCK | _FS_MAKE_SYM)
    all_write = _FS_WRITE_FILE | creating | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(all_write, (_NET_BIND_TCP | _NET_CONNECT_TCP) if (block_tcp and abi >= 4) else 0,
                        (_SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET) if (scope and abi >= 6) else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    fd = _libc.syscall(_SYS_landlock_create_ruleset, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return []
    try:
        for path, rights in [(p, all_write) for p in writable] + [
                (p, _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0)) for p in device_dirs]:
            if not os.path.exists(path):
                continue
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(rights if os.path.isdir(path) else rights & (_FS_WRITE_FILE | _FS_TRUNCATE), pfd)
                if _libc.syscall(_SYS_landlock_add_rule, ctypes.c_int(fd), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                                 ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    return []
            finally:
                os.close(pfd)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return []
        if _libc.syscall(_SYS_landlock_restrict_self, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return []
    finally:
        os.close(fd)
    applied = ["landlock_fs"]
    if attr.handled_access_net:
        applied.append("landlock_tcp")
    if attr.scoped:
        applied.append("landlock_signal_scope")
    return applied
