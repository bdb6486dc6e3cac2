"""The per-turn score from a sandbox verdict (Kevin-32B: 0.3 * correct + speedup * correct)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.result import SandboxResult

if TYPE_CHECKING:
    from rewards.config import RewardConfig

EXCESSIVE_FLAG = "excessive_speedup"


@dataclass(frozen=True)
class ScoreBreakdown:
    score: float
    credited_speedup: float | None  # the speedup that entered the score (after cap / flag policy)
    note: str = ""                  # why the speedup was not taken as measured ("" when it was)


def score_result(result: SandboxResult, cfg: RewardConfig, violations: bool = False) -> ScoreBreakdown:
    """``cfg`` carries correct_weight, speedup_weight, speedup_cap, excessive_speedup_policy.

    0 for any rule violation (static, or caught by the sandbox at run time: ``rule_violation``) or
    incorrect answer. A correct answer that was not timed (e.g. the
    Triton interpreter on a CPU) earns ``correct_weight`` only. A speedup the sandbox flagged as
    excessive is not rewarded blindly: it is capped or zeroed (``excessive_speedup_policy``).
    """
    if violations or not result.correct or result.error_kind == "rule_violation":
        return ScoreBreakdown(0.0, None)
    base = cfg.correct_weight
    if not result.timed or result.speedup is None:
        return ScoreBreakdown(base, None, "not timed: correctness credit only")
    speedup, note = float(result.speedup), ""
    if EXCESSIVE_FLAG in result.flags:
        if cfg.excessive_speedup_policy == "zero":
            return ScoreBreakdown(base, 0.0, f"speedup {speedup:.2f}x flagged as excessive: not credited")
        note = f"speedup {speedup:.2f}x flagged as excessive: capped"
        speedup = min(speedup, cfg.speedup_cap) if cfg.speedup_cap is not None else speedup
    if cfg.speedup_cap is not None and speedup > cfg.speedup_cap:
        note = note or f"speedup {speedup:.2f}x capped at {cfg.speedup_cap:g}x"
        speedup = cfg.speedup_cap
    speedup = max(speedup, 0.0)
    return ScoreBreakdown(base + cfg.speedup_weight * speedup, speedup, note)
