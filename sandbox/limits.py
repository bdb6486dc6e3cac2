"""How long a run step and one call of the answer may take, and whether a failure is re-run alone.

The limits are sized from the task (its reference time, once a step measured it): a fixed limit
either cuts slow tasks' correct answers or lets a never-ending kernel hold the GPU and its batch's
last reward for minutes. Pure functions of the configuration and a step's outcome, for the pool
(and call_limit for the judge too).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the judge imports call_limit, and none of the pool's modules
    from sandbox.config import SandboxConfig
    from sandbox.launch import StepOutcome
    from sandbox.wire import StepRequest


def maybe_crowded(out: StepOutcome) -> bool:
    """A failure another step on the same device could have caused: a timeout, or out of memory."""
    data = out.data or {}
    if "call_over_limit" in (data.get("flags") or ()):  # 1000x the reference: not what sharing does
        return False
    if out.killed_for in ("timeout", "memory"):
        return True
    text = f"{data.get('error_kind')} {data.get('error')}".lower()
    return data.get("error_kind") in ("timeout", "memory_limit") or "out of memory" in text


def run_limit(cfg: SandboxConfig, ref_ms: float | None) -> float:
    """The run step's time limit, sized from the task once its reference time is known: the
    configured limit, plus ten times the calls of a step at the reference's speed (a task whose
    forward takes a second must not time out where a millisecond one would not)."""
    if not ref_ms:
        return float(cfg.run_timeout_s)
    calls = 2 * cfg.correctness_trials + cfg.warmup_runs + cfg.timing_runs * (1 + 2 * cfg.checked_share) + 2
    if cfg.timing_probe:  # four more timed windows (run_timing.Timing._probe)
        calls += 4 * (cfg.warmup_runs + cfg.timing_runs)
    return float(cfg.run_timeout_s) + 10.0 * calls * ref_ms / 1000.0


def call_limit(cfg: SandboxConfig | StepRequest, ref_ms: float | None) -> float | None:
    """One call of the answer, at most, once the reference's time is known (to the pool, or to the
    judge from its own first call of the reference, run_step): a kernel that never
    ends (an RL policy writes them: a loop bound sampled wrong) then holds its step, its GPU
    reservation and its batch's last reward for ~20 s rather than the whole run limit twice over
    (the limit, then the re-run alone that a timeout while sharing gets). A thousand times the
    reference is far past what sharing the GPU with a few steps does to a call, and above the
    average a call may take within the step's own limit (run_limit: the configured limit over a
    step's ~27 calls, plus ten times the reference): an answer this slow at every call fails that
    limit too, only minutes later; the floor, tripled for the answer's first call (run_step), covers a first call's
    lazy CUDA and Triton set-up."""
    if not ref_ms:
        return None
    return max(float(cfg.call_timeout_floor_s), float(cfg.call_timeout_ref_factor) * ref_ms / 1000.0)
