"""What a kernel build and run may read under Landlock (:func:`sandbox.isolation.restrict_access`).

Reads are confined so that a candidate cannot take what lies elsewhere on the host: the project
checkout (its configs, other tasks' answers, .git), /root and /home (keys, tokens), /tmp and /run
(other processes' sockets and files), /etc beyond the few files the C library and compilers open.
Landlock rules bind inodes, so every path is resolved (symlinks followed) and missing ones skipped.
Only the standard library: this runs before torch is imported.
"""
from __future__ import annotations

import glob
import os
import shutil
import site
import sys

# the checkout: <root>/sandbox is this package
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

# Trees of the system: the compilers (/usr/bin, /usr/lib/gcc, /usr/include), shared libraries,
# CUDA toolkits (/usr/local/cuda*, /opt), sysfs (the driver and OpenMP read topology), and /proc
# (the worker mounts a private one where it can).
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/opt", "/usr/local", "/sys", "/proc")
# /etc: files only, what the dynamic loader, the C library's name and time lookups, Python's
# mimetypes/platform and update-alternatives (cc, c++) open. Never shadow, ssh, ssl keys, etc.
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ld.so.preload", "localtime", "timezone", "nsswitch.conf",
              "passwd", "group", "hosts", "host.conf", "gai.conf", "alternatives", "os-release", "mime.types")
# Device files a run needs, read and written (existing files only). Not /dev as a whole: a process
# of uid 0 keeps owner access without capabilities, and /dev/vda (raw disk) or /dev/kmsg are root's.
_DEVICE_GLOBS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                 "/dev/nvidiactl", "/dev/nvidia[0-9]*", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                 "/dev/nvidia-modeset", "/dev/nvidia-caps", "/dev/nvidia-caps-imex-channels",
                 "/dev/dri", "/dev/kfd", "/dev/dxg")


def _real(path: str) -> str | None:
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    return real if os.path.exists(real) else None


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def default_device_paths() -> list[str]:
    """The existing device files (and GPU device dirs) of :data:`_DEVICE_GLOBS`, resolved: pass them
    as ``device_dirs`` to restrict_access, and they are readable too (default_read_roots)."""
    out: list[str] = []
    for pattern in _DEVICE_GLOBS:
        for path in sorted(glob.glob(pattern)):
            real = _real(path)
            if real and real not in out:
                out.append(real)
    return out


def _cuda_dirs() -> list[str]:
    dirs = [os.environ.get(k, "") for k in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")] + glob.glob("/usr/local/cuda*")
    nvcc = shutil.which("nvcc")
    if nvcc:
        bin_dir = os.path.dirname(os.path.realpath(nvcc))
        dirs.append(bin_dir)
        if os.path.basename(bin_dir) == "bin":  # the toolkit: its lib64, nvvm, include beside bin
            dirs.append(os.path.dirname(bin_dir))
    return [d for d in dirs if d]


def _python_dirs(root: str) -> list[str]:
    """The interpreter's prefixes and import path, without the checkout: an entry that is the root
    becomes <root>/sandbox; one above the root is dropped; one inside it is kept only within the
    virtual environment (a venv in the checkout, e.g. <root>/.venv) or <root>/sandbox."""
    venv = _real(sys.prefix) if sys.prefix != sys.base_prefix else None
    own = os.path.join(root, "sandbox")
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]
    try:
        paths += site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    except AttributeError:  # an old virtualenv's site module
        pass
    out: list[str] = []
    for path in paths:
        real = _real(path) if isinstance(path, str) and os.path.isabs(path) else None
        if real is None:
            continue
        if real == root:
            real = own
        elif _within(root, real):
            continue
        elif _within(real, root) and not (_within(real, own) or (venv and _within(real, venv))):
            continue
        out.append(real)
    return out + [own]


def _system_dirs(root: str) -> list[str]:
    """:data:`_SYSTEM_DIRS` and the CUDA toolkit; a tree that holds the checkout (/opt/app, say)
    is taken apart: every branch of it except the one that leads to the checkout."""
    out: list[str] = []
    for path in (*_SYSTEM_DIRS, *_cuda_dirs()):
        real = _real(path)
        if real is None:
            continue
        stack = [real]
        while stack:
            top = stack.pop()
            if top == root or not _within(root, top):
                out += [] if top == root else [top]
                continue
            try:
                stack += [os.path.join(top, name) for name in os.listdir(top)]
            except OSError:
                pass
    return out


def default_read_roots(extra: list[str] | None = None) -> list[str]:
    """Directories (and /etc files) readable under restrict_access: the interpreter and its
    packages (:func:`_python_dirs`), the system trees and the CUDA toolkit, the device files of
    :func:`default_device_paths` and /dev/shm, a few /etc files, and ``extra`` (the caller's work,
    build, precompiled-header and header dirs). Nothing of /root, /home, /tmp, /run or /var
    unless it is one of those (pyenv's prefix under /root is allowed as itself, not /root)."""
    root = PROJECT_ROOT
    wanted = (_python_dirs(root) + _system_dirs(root) + default_device_paths() + ["/dev/shm"]
              + [os.path.join("/etc", name) for name in _ETC_FILES] + list(extra or []))
    out: list[str] = []
    for path in wanted:
        real = _real(path)
        if real and real not in out:
            out.append(real)
    # one rule per tree: what lies beneath another entry adds nothing
    return [p for p in out if not any(q != p and _within(p, q) for q in out)]
