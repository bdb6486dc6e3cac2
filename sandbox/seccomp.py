"""A seccomp filter (classic BPF, written out here) against the system calls a candidate has no
business making. Denied calls fail with EPERM; everything else is allowed.

Why each group:
* connect() of every socket fails with ENOENT, and socket() of any family but AF_INET/AF_INET6
  and stream or seqpacket AF_UNIX is refused: Landlock (ABI <= 7) does not cover connecting to
  pathname unix sockets, so the host's (e.g. /tmp/ray/session_*/sockets, /run/...) would be
  reachable; a datagram unix socket could send to a path without connect(); netlink and packet
  sockets probe the host's network setup; vsock is not confined by a network namespace and may
  lead to a VM's host. TCP stays with the network namespace and Landlock.
  On the H200 (2026-12-04, bench.cuda_isolation) CUDA failed to start (error 304) when socket(AF_UNIX)
  was refused, and started when it was allowed: the driver makes a unix socket to reach
  nvidia-persistenced, and a failed connect() (ENOENT, as when no daemon runs) is what it copes with.
  socketpair(AF_UNIX) (another system call) stays: Python, torch and CUDA use it.
* sched_setaffinity/setscheduler/setparam/setattr: the affinity drop_privileges set is enforced,
  no realtime to starve other evaluations, and no changing another process's (the judge's) policy
  or CPUs. setpriority only as nice() does it, on itself (PRIO_PROCESS, 0) and to a value 0..19:
  lowering one's own priority is harmless (a candidate may do it; RLIMIT_NICE forbids raising it),
  while PRIO_USER would renice every process of uid 0 in sight, the pool's among them.
* unshare, setns, clone() with a CLONE_NEW* flag, the mount family (mount, umount2, pivot_root,
  chroot, open_tree, move_mount, fs*, mount_setattr): no user namespace in which to regain
  capabilities, no way out of or around the sandbox's own namespaces and mounts.
  clone3 gets ENOSYS (its flags are behind a pointer a filter cannot read): the C library then
  falls back to clone(), whose flags are checked. Docker's default profile does the same.
* ptrace, process_vm_readv/writev, pidfd_getfd: no reading other processes (the harness!).
* kexec_*, *init_module, delete_module, bpf, perf_event_open, keyctl family, io_uring_*,
  userfaultfd, mknod/mknodat, sethostname/setdomainname, reboot, swapon/off, open_by_handle_at:
  kernel attack surface or host state a kernel benchmark never needs.
CUDA: libcuda tries to connect to nvidia-persistenced's (and MPS's) unix socket and works without
it; on a host that REQUIRES MPS this filter must be dropped. Not tested on a GPU here.

Installed with TSYNC (every thread), after no_new_privs, as the last measure: it denies the
sched_setaffinity drop_privileges needs. Other architectures than x86_64 and aarch64: nothing
installed, nothing recorded. A call made under another ABI (i386 int 0x80, x32) is denied.
"""
from __future__ import annotations

import ctypes
import errno
import platform

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYS_seccomp = {"x86_64": 317, "aarch64": 277}
_X32_SYSCALL_BIT = 0x40000000

# (name, x86_64 number, aarch64 number); None where the call does not exist (from the kernel's
# asm/unistd_64.h and asm-generic/unistd.h)
_DENIED = (
    ("sched_setparam", 142, 118), ("sched_setscheduler", 144, 119), ("sched_setaffinity", 203, 122),
    ("sched_setattr", 314, 274),
    ("unshare", 272, 97), ("setns", 308, 268), ("mount", 165, 40), ("umount2", 166, 39),
    ("pivot_root", 155, 41), ("chroot", 161, 51), ("open_tree", 428, 428), ("move_mount", 429, 429),
    ("fsopen", 430, 430), ("fsconfig", 431, 431), ("fsmount", 432, 432), ("fspick", 433, 433),
    ("mount_setattr", 442, 442),
    ("ptrace", 101, 117), ("process_vm_readv", 310, 270), ("process_vm_writev", 311, 271),
    ("pidfd_getfd", 438, 438),
    ("kexec_load", 246, 104), ("kexec_file_load", 320, 294), ("init_module", 175, 105),
    ("finit_module", 313, 273), ("delete_module", 176, 106), ("bpf", 321, 280), ("perf_event_open", 298, 241),
    ("add_key", 248, 217), ("request_key", 249, 218), ("keyctl", 250, 219),
    ("io_uring_setup", 425, 425), ("io_uring_enter", 426, 426), ("io_uring_register", 427, 427),
    ("userfaultfd", 323, 282), ("mknod", 133, None), ("mknodat", 259, 33),
    ("sethostname", 170, 161), ("setdomainname", 171, 162), ("reboot", 169, 142),
    ("swapon", 167, 224), ("swapoff", 168, 225), ("open_by_handle_at", 304, 265),
    # another process's I/O priority: the kernel checks only the uid (all of a step's are 0)
    ("ioprio_set", 251, 30),
)
_SOCKET = {"x86_64": 41, "aarch64": 198}
_CONNECT = {"x86_64": 42, "aarch64": 203}
_PRLIMIT = {"x86_64": 302, "aarch64": 261}
_AF_UNIX, _SOCK_STREAM, _SOCK_SEQPACKET, _SOCK_TYPE_MASK = 1, 1, 5, 0xF
_CLONE = {"x86_64": 56, "aarch64": 220}
_SETPRIORITY = {"x86_64": 141, "aarch64": 140}
_CLONE3 = 435
_AF_INET, _AF_INET6 = 2, 10
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# classic BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JGT_K, _JGE_K, _JSET_K, _RET_K, _ALU_AND_K = 0x20, 0x15, 0x25, 0x35, 0x45, 0x06, 0x54
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
# struct seccomp_data: nr, arch, then args[i] at 16 + 8 i (the low half first: little endian)
_OFF_NR, _OFF_ARCH, _OFF_ARG0, _OFF_ARG1, _OFF_ARG2 = 0, 4, 16, 24, 32
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _assemble(prog: list[tuple]) -> list[tuple[int, int, int, int]]:
    """Resolve labels: an entry is ``"label"`` or ``(code, jt, jf, k)`` with jt/jf a label or 0
    (the next instruction)."""
    labels, body = {}, []
    for item in prog:
        if isinstance(item, str):
            labels[item] = len(body)
        else:
            body.append(item)
    out = []
    for i, (code, jt, jf, k) in enumerate(body):
        offs = [labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        if not all(0 <= o <= 255 for o in offs):
            raise ValueError("BPF jump out of range")
        out.append((code, offs[0], offs[1], k))
    return out


def build_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for ``machine`` (platform.machine()), as (code, jt, jf, k) instructions."""
    prog: list[tuple] = [(_LD_W_ABS, 0, 0, _OFF_ARCH), (_JEQ_K, 0, "deny", _AUDIT_ARCH[machine]),
                         (_LD_W_ABS, 0, 0, _OFF_NR)]
    if machine == "x86_64":
        prog.append((_JGE_K, "deny", 0, _X32_SYSCALL_BIT))
    col = 1 if machine == "x86_64" else 2
    for entry in _DENIED:
        if entry[col] is not None:
            prog.append((_JEQ_K, "deny", 0, entry[col]))
    prog += [(_JEQ_K, "socket", 0, _SOCKET[machine]), (_JEQ_K, "clone", 0, _CLONE[machine]),
             (_JEQ_K, "enosys", 0, _CLONE3), (_JEQ_K, "noent", 0, _CONNECT[machine]),
             (_JEQ_K, "setpriority", 0, _SETPRIORITY[machine]), (_JEQ_K, "self_only", 0, _PRLIMIT[machine]),
             (_RET_K, 0, 0, _RET_ALLOW),
             # prlimit64 on itself only (pid 0, as setrlimit/getrlimit call it): every process of a step
             # is uid 0, and the kernel checks only the uid for another's limits, not ptrace rights
             # (the red team lowered its judge's RLIMIT_NOFILE through it)
             "self_only", (_LD_W_ABS, 0, 0, _OFF_ARG0), (_JEQ_K, "allow", "deny", 0),
             "socket", (_LD_W_ABS, 0, 0, _OFF_ARG0), (_JEQ_K, "allow", 0, _AF_INET), (_JEQ_K, "allow", 0, _AF_INET6),
             (_JEQ_K, 0, "deny", _AF_UNIX),
             # a unix socket of the stream kinds only: a datagram one could send to a path without connect()
             (_LD_W_ABS, 0, 0, _OFF_ARG1), (_ALU_AND_K, 0, 0, _SOCK_TYPE_MASK), (_JEQ_K, "allow", 0, _SOCK_STREAM),
             (_JEQ_K, "allow", "deny", _SOCK_SEQPACKET),
             "clone", (_LD_W_ABS, 0, 0, _OFF_ARG0), (_JSET_K, "deny", "allow", _CLONE_NEW_ANY),
             # which == PRIO_PROCESS, who == 0 (itself), 0 <= nice <= 19 (a negative one reads > 19)
             "setpriority", (_LD_W_ABS, 0, 0, _OFF_ARG0), (_JEQ_K, 0, "deny", 0), (_LD_W_ABS, 0, 0, _OFF_ARG1),
             (_JEQ_K, 0, "deny", 0), (_LD_W_ABS, 0, 0, _OFF_ARG2), (_JGT_K, "deny", "allow", 19),
             "allow", (_RET_K, 0, 0, _RET_ALLOW),
             "deny", (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
             "enosys", (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
             "noent", (_RET_K, 0, 0, _RET_ERRNO | errno.ENOENT)]
    return _assemble(prog)


def install_filter() -> list[str]:
    """Install the filter on every thread of this process; ``["seccomp"]`` when it is in force.
    Sets no_new_privs first (needed without CAP_SYS_ADMIN). Irrevocable, inherited by children."""
    machine = platform.machine()
    if machine not in _AUDIT_ARCH:
        return []
    insns = build_program(machine)
    arr = (_SockFilter * len(insns))(*[_SockFilter(*i) for i in insns])
    fprog = _SockFprog(len(insns), arr)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return []
    if libc.syscall(ctypes.c_long(_SYS_seccomp[machine]), ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
                    ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(fprog)) == 0:
        return ["seccomp"]
    # no seccomp(2) (kernels before 3.17): this thread only, so call it while single-threaded
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0:
        return ["seccomp"]
    return []
