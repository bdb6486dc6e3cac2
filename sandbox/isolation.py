"""OS-level confinement of one worker process: resource limits, namespaces, mounts, Landlock.

Each measure is tried and recorded; where the kernel or the privileges do not allow one, the
worker goes on without it and the result says which measures were in force (``isolation``).
Only the standard library: this runs before torch is imported.

Order that works (each step needs what the later ones take away):
  outer:    set_rlimits, unshare_namespaces(..., uts=, ipc=)  (unshare needs CAP_SYS_ADMIN or a user ns)
  harness:  mount_private_proc, mount_private_shm, mount_quota_dir  (mounting needs the caps, and a
            Landlock domain may not mount), then restrict_access (proc_dir="/proc")
  candidate (forked by the harness, before its code is imported): restrict_access (its own
            /proc/<pid>/task), drop_privileges(cpus) (PR_CAPBSET_DROP and the securebits need
            CAP_SETPCAP, so before anything else that drops it; it works under Landlock), then
            install_filter LAST: it denies the sched_setaffinity drop_privileges uses.
  The harness may take drop_privileges and install_filter too, in that order, if it needs neither
  capabilities nor the denied calls afterwards (forking a candidate needs neither).
Capabilities, no_new_privs and Landlock are per thread (seccomp is synced to every thread): call
all of this while the process has one thread (before torch starts any).
"""
from __future__ import annotations

import ctypes
import errno
import os
import resource
import stat
from pathlib import Path

from sandbox.privileges import drop_privileges  # noqa: F401 - part of this module's interface
from sandbox.read_roots import default_device_paths, default_read_roots  # noqa: F401
from sandbox.seccomp import install_filter  # noqa: F401

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000

_SYS_landlock_create_ruleset, _SYS_landlock_add_rule, _SYS_landlock_restrict_self = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

# Landlock filesystem rights (linux/landlock.h)
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_REMOVE_DIR, _FS_REMOVE_FILE = 1 << 4, 1 << 5
_FS_MAKE_CHAR, _FS_MAKE_DIR, _FS_MAKE_REG, _FS_MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
_FS_MAKE_FIFO, _FS_MAKE_BLOCK, _FS_MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14
# the only rights a rule on a file (not a directory) may carry; IOCTL_DEV (ABI 5) is not handled:
# the GPU driver lives on ioctls to /dev/nvidia*, and the device files are narrowed by path instead
_FS_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE
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


# The mount namespace this process was in before unshare_namespaces made a new one: the mount
# functions below refuse to run in it (a tmpfs over the host's /dev/shm would hide it from the host).
_MNTNS_BEFORE: int | None = None


def _mntns() -> int | None:
    try:
        return os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        return None


def unshare_namespaces(network: bool, pids: bool, mounts: bool | None = None, *, uts: bool = False,
                       ipc: bool = False) -> list[str]:
    """New network, PID, mount, UTS and IPC namespaces (as root, or through a user namespace).
    Returns what was made. ``mounts`` defaults to ``pids``: the mount namespace is there so the
    PID namespace's first child can mount its own /proc (:func:`mount_private_proc`), hiding the
    host's processes and their environments. ``uts``: a hostname of its own (sethostname cannot
    reach the host's); ``ipc``: System V shared memory, semaphores, message queues and POSIX
    mqueues of its own (another evaluation's segments cannot be attached).
    """
    global _MNTNS_BEFORE
    mounts = pids if mounts is None else mounts
    flags = ((_CLONE_NEWNET if network else 0) | (_CLONE_NEWPID if pids else 0) | (_CLONE_NEWNS if mounts else 0)
             | (_CLONE_NEWUTS if uts else 0) | (_CLONE_NEWIPC if ipc else 0))
    if not flags:
        return []
    uid, gid, before = os.getuid(), os.getgid(), _mntns()
    if _libc.unshare(flags) != 0:
        if ctypes.get_errno() != errno.EPERM or _libc.unshare(flags | _CLONE_NEWUSER) != 0:
            return []
        _map_own_ids(uid, gid)
    if mounts:
        _MNTNS_BEFORE = before
    names = [("netns", network), ("pidns", pids), ("mountns", mounts), ("utsns", uts), ("ipcns", ipc)]
    return [name for name, wanted in names if wanted]


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


_MS_RDONLY, _MS_REMOUNT = 1, 32


def readonly_proc_sys() -> list[str]:
    """/proc/sys read-only in this mount namespace (``proc_sys_ro``): sysctls are the host's (most
    are not namespaced), and uid 0 without capabilities still owns them (core_pattern would run a
    program of the writer's choosing as root at the host's next core dump). Call after
    mount_private_proc, before Landlock."""
    if _MNTNS_BEFORE is None or _mntns() in (None, _MNTNS_BEFORE) or not os.path.isdir("/proc/sys"):
        return []
    if _libc.mount(b"/proc/sys", b"/proc/sys", None, ctypes.c_ulong(_MS_BIND | _MS_REC), None) != 0:
        return []
    flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    return ["proc_sys_ro"] if _libc.mount(None, b"/proc/sys", None, ctypes.c_ulong(flags), None) == 0 else []


def mount_overlay(path: str, scratch: str) -> list[str]:
    """An overlay over the directory ``path`` at the same place (``build_dir_overlay``): reads see
    it, writes land in ``scratch`` (upper and work dirs made there), which goes with the step. A run
    step's build dir is the cache's, shared by every later evaluation of the answer: nothing a
    candidate writes there may stay. Same place in the order as :func:`mount_private_shm`."""
    if _MNTNS_BEFORE is None or _mntns() in (None, _MNTNS_BEFORE) or not os.path.isdir(path):
        return []
    upper, work = os.path.join(scratch, "upper"), os.path.join(scratch, "work")
    try:
        os.makedirs(upper, exist_ok=True)
        os.makedirs(work, exist_ok=True)
    except OSError:
        return []
    opts = f"lowerdir={path},upperdir={upper},workdir={work}".encode()
    ok = _libc.mount(b"overlay", path.encode(), b"overlay", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV), opts) == 0
    return ["build_dir_overlay"] if ok else []


def _mount_tmpfs(path: str, options: str) -> bool:
    """A tmpfs on ``path``, only in a mount namespace unshare_namespaces made, with propagation
    made private first so that the mount never reaches the host's namespace."""
    if _MNTNS_BEFORE is None or _mntns() in (None, _MNTNS_BEFORE):
        return False
    if _libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        return False
    return _libc.mount(b"tmpfs", path.encode(), b"tmpfs", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV),
                       options.encode()) == 0


def mount_private_shm(size_bytes: int, nr_inodes: int) -> list[str]:
    """A fresh, size-limited /dev/shm (``private_shm``): the host's and other evaluations' shared
    memory segments are out of sight, and filling it cannot fill the host's. Call in the harness
    after unshare_namespaces(mounts=True) and before Landlock (a Landlock domain may not mount);
    Landlock rules on /dev/shm made afterwards bind to this tmpfs."""
    if not os.path.isdir("/dev/shm"):
        return []
    ok = _mount_tmpfs("/dev/shm", f"size={int(size_bytes)},nr_inodes={int(nr_inodes)},mode=1777")
    return ["private_shm"] if ok else []


def mount_quota_dir(path: str, size_bytes: int, nr_inodes: int) -> list[str]:
    """A size- and inode-limited tmpfs over the existing directory ``path`` (``dir_quota``), with
    its owner and mode. Only on an EMPTY directory: a mount hides what lies beneath it, so a
    non-empty one is left alone (nothing recorded). The tmpfs lives as long as the mount namespace:
    files in it are gone when the step's processes are, and processes outside the namespace (the
    pool) never see them. Same place in the order as :func:`mount_private_shm`. A process whose
    working directory was ``path`` is moved onto the tmpfs (its cwd would still be the old inode)."""
    try:
        st = os.stat(path)
        if os.listdir(path):
            return []
        cwd_here = os.path.samestat(os.stat("."), st)
    except OSError:
        return []
    opts = (f"size={int(size_bytes)},nr_inodes={int(nr_inodes)},mode={st.st_mode & 0o7777:o},"
            f"uid={st.st_uid},gid={st.st_gid}")
    if not _mount_tmpfs(path, opts):
        return []
    if cwd_here:
        os.chdir(path)
    return ["dir_quota"]


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


def restrict_access(read_roots: list[str], write_roots: list[str], device_dirs: list[str], *, block_tcp: bool,
                    scope: bool = True, proc_dir: str | None = None, list_dirs: tuple[str, ...] = ("/dev",)
                    ) -> list[str]:
    """Landlock with reads confined too: read and execute only beneath ``read_roots``; read and
    write (create, remove, rename, truncate) beneath ``write_roots``; read and write, but no
    creating, of the files existing beneath ``device_dirs`` and ``proc_dir`` (pass the device
    FILES of :func:`default_device_paths`, not /dev: as uid 0 without capabilities a process still
    owns /dev/vda and /dev/kmsg); listing only of ``list_dirs`` (drivers enumerate /dev). A path
    may be a file. Symlinks are followed (rules bind inodes), missing paths skipped. Records
    ``landlock_fs``, ``landlock_read``, ``landlock_tcp`` (ABI 4), ``landlock_signal_scope`` (ABI 6:
    no signals to, and no abstract unix sockets of, processes outside the domain)."""
    devices = list(device_dirs) + ([proc_dir] if proc_dir else [])
    return _landlock(read_roots, write_roots, devices, list(list_dirs), block_tcp, scope, reads=True)


def restrict_writes(writable: list[str], device_dirs: list[str], block_tcp: bool, scope: bool = True) -> list[str]:
    """Landlock: writes only beneath ``writable`` (and to existing files under ``device_dirs``);
    reads are not confined. No TCP bind/connect when ``block_tcp``; with ``scope``, no signals to
    and no abstract unix sockets of processes outside. Returns what applied."""
    return _landlock([], writable, device_dirs, [], block_tcp, scope, reads=False)


def _landlock(read_roots: list[str], write_roots: list[str], devices: list[str], list_dirs: list[str],
              block_tcp: bool, scope: bool, reads: bool) -> list[str]:
    abi = landlock_abi()
    if abi < 1:
        return []
    creating = (_FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_CHAR | _FS_MAKE_DIR | _FS_MAKE_REG
                | _FS_MAKE_SOCK | _FS_MAKE_FIFO | _FS_MAKE_BLOCK | _FS_MAKE_SYM)
    truncate = _FS_TRUNCATE if abi >= 3 else 0
    all_write = _FS_WRITE_FILE | creating | (_FS_REFER if abi >= 2 else 0) | truncate
    read = (_FS_READ_FILE | _FS_READ_DIR) if reads else 0
    handled = all_write | (read | _FS_EXECUTE if reads else 0)
    attr = _RulesetAttr(handled, (_NET_BIND_TCP | _NET_CONNECT_TCP) if (block_tcp and abi >= 4) else 0,
                        (_SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET) if (scope and abi >= 6) else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    rules = ([(p, read | _FS_EXECUTE) for p in read_roots] + [(p, read | all_write) for p in write_roots]
             + [(p, read | _FS_WRITE_FILE | truncate) for p in devices] + [(p, read & _FS_READ_DIR) for p in list_dirs])
    fd = _libc.syscall(_SYS_landlock_create_ruleset, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return []
    try:
        for path, rights in rules:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                    rights &= _FS_FILE_RIGHTS
                if not rights:
                    continue
                rule = _PathBeneathAttr(rights, pfd)
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
    applied = ["landlock_fs"] + (["landlock_read"] if reads else [])
    if attr.handled_access_net:
        applied.append("landlock_tcp")
    if attr.scoped:
        applied.append("landlock_signal_scope")
    return applied
