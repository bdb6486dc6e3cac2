"""The record one evaluation produces. Plain data: it crosses process and Ray boundaries."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from sandbox.flags import DISALLOWED_MESSAGE

# The flag of a build the build hook refused (sandbox.flags): the call raised before anything was built
REFUSED_BUILD = "disallowed_build_argument"
# the stages of an evaluation under way, in order (SandboxPool.in_flight counts them; its
# ``oldest_stage`` is an index into this)
IN_FLIGHT_STAGES = ("queued", "build", "run")

# Stages in protocol order; `stage` names the last one reached.
STAGES = ("load", "compile", "correctness", "timing", "done")

# Error kinds a result can carry (``error_kind``); None when the candidate passed.
ERROR_KINDS = (
    "load_error",        # the candidate source does not import / defines no ModelNew
    "compile_error",     # the C++/CUDA/Triton build failed
    "compile_timeout",
    "runtime_error",     # ModelNew raised, or the process died (segfault, CUDA fault)
    "timeout",           # correctness or timing ran past its wall limit
    "memory_limit",      # killed by the memory limit
    "wrong_output",      # shape/dtype/NaN/tolerance mismatch
    "reference_error",   # the task's own reference failed: not the candidate's fault
    "sandbox_error",     # the evaluator itself failed (worker lost twice, ...)
    # the sandbox caught, at run time, a behaviour the protocol forbids; ``flags`` names it
    "rule_violation",
)


@dataclass
class SandboxResult:
    """Verdict of one candidate against one reference."""

    stage: str = "load"
    compiled: bool = False
    correct: bool = False
    error_kind: str | None = None
    error: str | None = None              # trimmed, human-readable
    which_output: int | None = None       # index of the first wrong output
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    trials_passed: int = 0
    trials: int = 0
    ref_runtime_ms: float | None = None   # median over timing runs
    new_runtime_ms: float | None = None
    speedup: float | None = None          # ref_runtime_ms / new_runtime_ms; None when not timed
    # interquartile range over the median of the timed calls (the judge's own clock): the noise
    new_runtime_spread: float | None = None
    ref_runtime_spread: float | None = None   # None when the reference time came from the cache
    timed: bool = False                   # False e.g. for the Triton interpreter: no speedup credit
    flags: list[str] = field(default_factory=list)   # e.g. "excessive_speedup", REFUSED_BUILD, "timing_cut" (a slow answer timed in fewer calls: sandbox.timing_budget_s)
    wall_s: dict[str, float] = field(default_factory=dict)  # per stage: compile, correctness, timing, total
    cache_hit: bool = False
    backend: str = ""
    device: str = ""
    # added by the sandbox (backward compatible): which OS measures confined the evaluation
    # (e.g. "netns", "pidns", "landlock_fs", "rlimit_as"), and the tail of its stdout/stderr.
    isolation: list[str] = field(default_factory=list)
    log_tail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SandboxResult":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def failure(cls, kind: str, message: str, stage: str = "load", **kw: Any) -> "SandboxResult":
        return cls(stage=stage, error_kind=kind, error=message, **kw)


def mark_refused_build(result: SandboxResult) -> SandboxResult:
    """``result`` with :data:`REFUSED_BUILD` in its flags when the build hook refused a call.

    The hook raises inside the candidate's process, which reports the step as compile_error,
    load_error or runtime_error depending on where the call was (import, compile step or
    ``forward``); only the hook's own message in the error or the log tail says which failures were
    refusals. The pool reads it here, so callers read a flag rather than the sandbox's wording.
    """
    text = f"{result.error or ''}\n{result.log_tail or ''}"
    if result.error_kind in ("compile_error", "load_error", "runtime_error") and DISALLOWED_MESSAGE in text \
            and REFUSED_BUILD not in result.flags:
        result.flags = [*result.flags, REFUSED_BUILD]
    return result
