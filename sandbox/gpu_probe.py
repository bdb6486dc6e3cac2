"""Which isolation the GPU survives: a trusted probe, stepped down one measure at a time.

On the lent H200 every CUDA evaluation failed at ``cudaGetDeviceCount()`` (error 304, "OS call
failed or operation not supported on this OS") under the full sandbox. Rather than guess which
measure a given host's driver cannot live with, the pool runs :data:`CUDA_PROBE_SRC` (its own code,
never a candidate's) in a real worker under the configured isolation before its first GPU run step;
if the device does not come up, it tries leaving out each measure of :data:`DROP_ORDER` alone,
then drops them cumulatively, until it does, and every later GPU run step of that pool uses the
first level that worked. (The cause on the H200 turned out to be Landlock denying the driver's
writes to /proc/<pid>/task/<tid>/comm, which the worker now allows: sandbox/worker.py _confine.)
Only the probe's outcome decides: nothing a candidate does can lower the isolation.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Awaitable, Callable

log = logging.getLogger("sandbox.gpu_probe")

# Least protective first (seccomp, privileges and read rules are the newest measures, the least
# proven against a driver). A PID namespace goes first and with its private /proc (the harness must
# never be pid 1 of a namespace that sees the host's /proc); "landlock" drops Landlock altogether
# (writes and TCP), so it is last: the network namespace is gone by then.
DROP_ORDER = ("seccomp", "privileges", "landlock_read", "pidns", "landlock_scope", "mountns", "netns", "landlock")
# The name each measure has in SandboxResult.isolation: a level whose measure was not in force changes
# nothing and is not run.
_APPLIED_NAME = {"seccomp": "seccomp", "privileges": "caps_dropped", "landlock_read": "landlock_read",
                 "pidns": "pidns", "landlock_scope": "landlock_signal_scope", "mountns": "mountns",
                 "netns": "netns", "landlock": "landlock_fs"}

CUDA_PROBE_SRC = """\
import torch
torch.cuda.init()
assert torch.cuda.device_count() >= 1, "no CUDA device visible"
x = torch.ones(1 << 20, device="cuda")
assert float((x + x).sum()) == 2.0 * (1 << 20)
torch.cuda.synchronize()
"""


@dataclasses.dataclass(frozen=True)
class IsolationProbe:
    """Trusted code that must run under a run step's isolation; ``backends`` it gates; with
    ``needs_gpu`` only run steps that hold a GPU (the default: CUDA, and Triton on a GPU)."""
    src: str = CUDA_PROBE_SRC
    backends: tuple[str, ...] = ("cuda", "triton")
    needs_gpu: bool = True

    def applies(self, backend: str, on_gpu: bool) -> bool:
        return backend in self.backends and (on_gpu or not self.needs_gpu)


@dataclasses.dataclass
class ProbeVerdict:
    dropped: tuple[str, ...]        # measures left out of the gated run steps (empty: none)
    worked: bool                    # False: the device failed even with every measure dropped
    isolation: list[str]            # what applied in the probe run that decided
    errors: list[str]               # the probe's error at each level that failed, in order


ProbeRun = Callable[[tuple[str, ...]], Awaitable[tuple[bool, str, "list[str] | None"]]]


async def choose_isolation(run: ProbeRun) -> ProbeVerdict:
    """``run(dropped)`` runs the probe once -> (ok, error, isolation applied or None when the worker
    gave no verdict). Leaves out one measure at a time, then one more after each failure, until
    the probe succeeds."""
    errors: list[str] = []
    tried: dict[tuple[str, ...], tuple[bool, list[str] | None]] = {}

    async def attempt(dropped: tuple[str, ...]) -> tuple[bool, list[str] | None]:
        if dropped not in tried:
            ok, err, applied = await run(dropped)
            if not ok:
                errors.append(f"{'+'.join(dropped) or 'full'}: {err}")
            tried[dropped] = ok, applied
        return tried[dropped]

    ok, applied = await attempt(())
    first_applied = applied or []
    in_force = [m for m in DROP_ORDER if applied is None or _APPLIED_NAME[m] in first_applied]
    if not ok:  # one measure alone first: on the H200 only Landlock was in the way, the rest can stay
        for measure in in_force:
            single_ok, single_applied = await attempt((measure,))
            if single_ok:
                return _stepped_down((measure,), single_applied or [], errors)
    dropped: tuple[str, ...] = ()
    for measure in DROP_ORDER:
        if ok:
            break
        dropped += (measure,)
        if applied is None or _APPLIED_NAME[measure] in applied:
            ok, applied = await attempt(dropped)
    if ok and not dropped:
        return ProbeVerdict((), True, applied or [], [])
    if ok:
        return _stepped_down(tuple(m for m in dropped if _APPLIED_NAME[m] in first_applied) or dropped,
                             applied or [], errors)
    log.error("GPU isolation probe: the device fails even with every sandbox measure dropped (%s); "
              "keeping full isolation, so GPU evaluations will fail as the probe did", errors[-1])
    return ProbeVerdict((), False, first_applied, errors)


def _stepped_down(lost: tuple[str, ...], applied: list[str], errors: list[str]) -> ProbeVerdict:
    log.warning("GPU isolation probe: the device does not start under the full sandbox (%s). "
                "GPU run steps of this pool now go without %s; isolation in force: %s",
                errors[0], ", ".join(lost), ", ".join(applied))
    return ProbeVerdict(lost, True, applied, errors)
