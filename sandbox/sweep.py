"""Killing what a step left running: one sweep for the judge (inside the step, before the
reference is timed) and the pool (after the step, for processes that escaped its group).

A process carries the step's marker variable (sandbox.wire.MARKER) in its environment unless it
cleared it; in the judge's own PID namespace every process but the judge and those it keeps is the
step's, marker or not. A process whose environment reads empty may be in the middle of an exec (a
leftover's grandchild, say): it is looked at again for a few rounds rather than skipped.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

from sandbox.wire import MARKER

_PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread (no environment, never ours)
_UNSURE_ROUNDS = 10


def kill_marked(marker: str | None, keep: Iterable[int] = (), everything: bool = False,
                rounds: int = 50) -> int:
    """SIGKILL every process carrying ``MARKER=marker`` (or, with ``everything``, every process in
    sight but ``keep``, this one and its parent), again until none is found; returns how many."""
    keep = {os.getpid(), os.getppid(), *keep}
    needle = f"{MARKER}={marker}".encode() if marker is not None else None
    killed = 0
    for round_ in range(rounds):  # again until none is found: a leftover may fork while we scan
        found = unsure = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in keep:
                continue
            pid = int(entry.name)
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[-1].split()
                if fields[0] == b"Z" or int(fields[6]) & _PF_KTHREAD:
                    continue  # already dead, waiting to be reaped; or a kernel thread
                if not everything:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        environ = f.read()
                    if not environ:  # mid-exec: look again
                        unsure += 1
                        continue
                    if needle not in environ.split(b"\0"):
                        continue
                os.kill(pid, signal.SIGKILL)
                found += 1
            except (OSError, IndexError, ValueError):
                continue
        reap_children()
        killed += found
        if not found and (not unsure or round_ >= _UNSURE_ROUNDS):
            break
        time.sleep(0.01)
    return killed


def signal_marked(marker: str, sig: int) -> int:
    """Send ``sig`` to every process carrying ``MARKER=marker`` (the pool freezing a step); how many."""
    needle = f"{MARKER}={marker}".encode()
    sent = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            os.kill(int(entry.name), sig)
            sent += 1
        except OSError:
            continue
    return sent


def reap_children() -> None:
    """Reap whatever exited among this process's children (a PID-namespace init inherits orphans)."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def wait_gone(marker: str, timeout_s: float = 5.0) -> bool:
    """Kill the marked processes and wait until none is left (their CUDA contexts freed with them),
    up to ``timeout_s``; True when none is left."""
    end = time.monotonic() + timeout_s
    while True:
        if kill_marked(marker, rounds=3) == 0 and not _any_marked(marker):
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.02)


def _any_marked(marker: str) -> bool:
    needle = f"{MARKER}={marker}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    return True
        except OSError:
            continue
    return False
