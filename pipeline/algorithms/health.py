"""Rollout health metrics of a batch of samples (before any filtering)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.sample import Sample

if TYPE_CHECKING:
    from pipeline.algorithms.config import AlgorithmConfig

_THINK_OPEN = "<think>"


def reasoning_starts_with(text: str, prefix: str) -> bool:
    """Does the response's reasoning start with ``prefix``? An opening ``<think>`` tag and leading
    whitespace are skipped (chat templates may or may not put the tag in the response)."""
    t = text.lstrip()
    if t.startswith(_THINK_OPEN):
        t = t[len(_THINK_OPEN):].lstrip()
    return t.startswith(prefix)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def rollout_metrics(samples: list[Sample], cfg: AlgorithmConfig) -> dict[str, float]:
    """``reward/*`` (turn scores, and per turn), ``response/*`` (length, truncation, Kevin's
    Not-Okay ratio: the share of responses whose reasoning does not start with
    ``cfg.not_okay_prefix``; it rises well before a policy collapses into junk)."""
    if not samples:
        return {}
    scores = [float(s.score) for s in samples]
    lengths = [float(len(s.response_ids)) for s in samples]
    n = len(samples)
    out = {
        "critic/score/mean": _mean(scores),
        "critic/score/std": (_mean([(x - _mean(scores)) ** 2 for x in scores])) ** 0.5,
        "critic/score/max": max(scores),
        "critic/score/min": min(scores),
        "critic/score/positive_frac": sum(1 for x in scores if x > 0) / n,
        "response_length/mean": _mean(lengths),
        "response_length/max": max(lengths),
        "response_length/clip_ratio": sum(1 for s in samples if s.truncated) / n,
    }
    texts = [s for s in samples if s.response_text]
    out["response_length/not_okay_ratio"] = (
        sum(1 for s in texts if not reasoning_starts_with(s.response_text, cfg.not_okay_prefix)) / len(texts)
        if texts else 0.0)
    by_turn: dict[int, list[float]] = {}
    for s in samples:
        by_turn.setdefault(s.turn, []).append(float(s.score))
    if len(by_turn) > 1:
        out.update({f"critic/score/turn{t}_mean": _mean(v) for t, v in sorted(by_turn.items())})
    return out
