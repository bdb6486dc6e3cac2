"""The host allocation poison of a runner, checked from outside it.

A runner turns glibc's allocation poison on (``mallopt(M_PERTURB, 0x100)``: every fresh host block
reads as NaN bytes) before each correctness call, so an output the answer leaves unwritten fails
the comparison. That setting lives in the candidate's process, where its code can turn it off
(a C++ ``mallopt``, or a rebound helper), and an unwritten output then passes on whatever the
block held. The judge does not ask the runner: it reads glibc's setting (the ``perturb_byte``
variable in libc's data) in the runner's memory through ``/proc/<pid>/mem``.

The variable is static, so it has no symbol: :func:`locate` finds it in the judge itself by
setting the poison to two unlikely values in turn and keeping the one word of libc's writable
memory that follows both. The runners are forks of the judge (no exec), so the same address holds
the same variable in them.
"""
from __future__ import annotations

import ctypes
import re

_M_PERTURB = -6
_PROBES = (0x5A17C3E1, 0x2E6B9D47, 0x13572468)


def _writable_libc_ranges() -> list[tuple[int, int]]:
    """libc's writable mappings and the anonymous one right after them (its .bss)."""
    ranges: list[tuple[int, int]] = []
    after_libc = False
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5] if len(parts) > 5 else ""
            is_libc = bool(re.search(r"/libc[.-][^/]*\.so", path)) or path.endswith("/libc.so.6")
            if is_libc and parts[1].startswith("rw"):
                ranges.append((lo, hi))
                after_libc = True
            elif after_libc and not path and parts[1].startswith("rw") and ranges and lo == ranges[-1][1]:
                ranges.append((lo, hi))
                after_libc = False
            elif not is_libc:
                after_libc = False
    return ranges


def locate() -> int | None:
    """The address of glibc's poison setting in this process, or None (not glibc, not found, or
    not unique). Leaves the poison off, as it is in the judge."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    ranges = _writable_libc_ranges()
    if not ranges:
        return None
    found: set[int] | None = None
    try:
        for value in _PROBES:
            if not mallopt(_M_PERTURB, value):
                return None
            needle = value.to_bytes(4, "little")
            here = set()
            for lo, hi in ranges:
                data = ctypes.string_at(lo, hi - lo)
                i = data.find(needle)
                while i >= 0:
                    if i % 4 == 0:
                        here.add(lo + i)
                    i = data.find(needle, i + 1)
            found = here if found is None else found & here
    finally:
        mallopt(_M_PERTURB, 0)
    return next(iter(found)) if found and len(found) == 1 else None


def read(pid: int, address: int) -> int | None:
    """glibc's poison setting in process ``pid`` (None where its memory cannot be read)."""
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
            f.seek(address)
            data = f.read(4)
    except OSError:
        return None
    return int.from_bytes(data, "little", signed=True) if len(data) == 4 else None


_ON = 0x100   # what a runner sets (sandbox/protocol.py _PERTURB_TO_NAN)


def disabled(pid: int, address: int | None, when: str) -> str | None:
    """Why the poison of runner ``pid`` is not on (a verdict's error), or None: on, or not checkable
    (not glibc; memory the judge cannot read, which :func:`readable` tells apart beforehand)."""
    if address is None:
        return None
    got = read(pid, address)
    if got is None and not _alive(pid):
        return None  # gone (exited after its reply): what follows judges that, not this check
    if got is None:
        return f"the host allocation poison could not be checked {when} a correctness call (the candidate's " \
               "memory became unreadable to the judge)"
    if got == _ON:
        return None
    return (f"the host allocation poison was off {when} a correctness call (glibc's M_PERTURB read {got:#x} in "
            f"the candidate's process, {_ON:#x} expected): the check for unwritten outputs was disabled")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
