"""Kevin's test-time beam search (Kevin-32B, Cognition 2025; docs/evaluation.md), run by
``python -m pipeline.evaluate evaluate.search=beam``.

Round 0: ``width`` fresh trajectories per task, ``turns_per_round`` turns each. After each round
a task's trajectories are ranked by their best kernel so far (:func:`rank`), the best ``keep`` are
copied ``width // keep`` times and every copy continues from its parent's full history for another
``turns_per_round`` turns; turn ids go on (round 1 has turns ``tpr .. 2*tpr - 1``). ``rounds``
rounds in all; the budget after round r is ``(r + 1) * turns_per_round`` turns.

A trajectory's best is taken over its lineage (its own turns and those of the trajectories it
continues, whose kernels are in its history), read from ``Sample.round`` / ``Sample.parent``.
Everything here but :func:`beam_search` is a pure function of Samples.
"""
from __future__ import annotations

import statistics
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass

from pipeline.eval_metrics import summarize
from pipeline.evaluate_config import BeamConfig
from pipeline.rollout import Start, Starts, turn_of
from pipeline.sample import Sample

TrajKey = tuple[str, int, int]  # (task_id, round, traj)


def check_beam(beam: BeamConfig, ks: Iterable[int]) -> list[str]:
    """Errors naming the key, empty when the beam config is usable."""
    errors = []
    for key in ("width", "keep", "turns_per_round", "rounds"):
        if getattr(beam, key) < 1:
            errors.append(f"evaluate.beam.{key}={getattr(beam, key)}: expected >= 1")
    if beam.keep > beam.width:
        errors.append(f"evaluate.beam.keep={beam.keep}: expected <= evaluate.beam.width={beam.width}")
    elif beam.keep >= 1 and beam.width % beam.keep:
        errors.append(f"evaluate.beam.width={beam.width}: expected a multiple of evaluate.beam.keep="
                      f"{beam.keep} (each kept trajectory is copied width/keep times)")
    bad = [k for k in ks if k < 1 or k > beam.width]
    if bad:
        errors.append(f"evaluate.ks={list(ks)}: with evaluate.search=beam every k must be in "
                      f"[1, evaluate.beam.width={beam.width}]")
    return errors


@dataclass(frozen=True)
class Best:
    """A trajectory's best so far: any correct turn, the fastest correct one, the top score."""

    correct: bool = False
    speedup: float = 0.0   # over correct turns only (a correct turn without a timing counts 0)
    score: float = 0.0     # over all turns: breaks ties where speedups are equal (or absent)

    def merge(self, other: "Best") -> "Best":
        speeds = [b.speedup for b in (self, other) if b.correct]
        return Best(self.correct or other.correct, max(speeds, default=0.0),
                    max(self.score, other.score))


def best_of(samples: Iterable[Sample]) -> Best:
    out = Best()
    for s in samples:
        o = s.outcome
        correct = o is not None and o.correct
        speedup = float(o.speedup or 0.0) if o is not None and o.correct else 0.0
        out = out.merge(Best(correct, speedup, float(s.score)))
    return out


def by_trajectory(samples: Iterable[Sample]) -> dict[TrajKey, list[Sample]]:
    out: dict[TrajKey, list[Sample]] = {}
    for s in samples:
        out.setdefault((s.task_id, s.round, s.traj), []).append(s)
    return {k: sorted(v, key=lambda s: s.turn) for k, v in out.items()}


def lineage_bests(samples: Iterable[Sample]) -> dict[TrajKey, Best]:
    """Per trajectory: the best over its own turns and its ancestors'."""
    groups = by_trajectory(samples)
    out: dict[TrajKey, Best] = {}
    for key in sorted(groups, key=lambda k: k[1]):  # parents (earlier rounds) first
        task, rnd, _ = key
        own = best_of(groups[key])
        parent = groups[key][0].parent
        inherited = out.get((task, rnd - 1, parent)) if parent is not None else None
        out[key] = own.merge(inherited) if inherited is not None else own
    return out


def rank(bests: Mapping[int, Best]) -> list[int]:
    """Trajectory indices, best first: correct before not, then faster, then higher score, then
    lower index (deterministic)."""
    return sorted(bests, key=lambda j: (not bests[j].correct, -bests[j].speedup, -bests[j].score, j))


def select_parents(bests: Mapping[int, Best], width: int, keep: int) -> list[int]:
    """For each of the next round's ``width`` trajectories, the index it continues: the best
    ``keep`` of ``bests``, each ``width // keep`` times."""
    kept = rank(bests)[:keep]
    copies = width // keep
    return [kept[i // copies] for i in range(width)]


def next_starts(samples: list[Sample], starts: Starts, task_ids: Iterable[str], rnd: int,
                beam: BeamConfig) -> dict[tuple[str, int], Start]:
    """Starts of round ``rnd + 1``, from the samples of rounds <= ``rnd`` and round ``rnd``'s
    starts (a parent's history = its start's history + its own scored turns; error turns, which
    end a trajectory, are not part of it, as in the rollout)."""
    groups = by_trajectory(samples)
    bests = lineage_bests(samples)
    out: dict[tuple[str, int], Start] = {}
    for task in task_ids:
        round_bests = {j: bests.get((task, rnd, j), Best()) for j in range(beam.width)}
        for j, p in enumerate(select_parents(round_bests, beam.width, beam.keep)):
            prev = starts.get((task, p))
            history = list(prev.history) if prev is not None else []
            history += [turn_of(s) for s in groups.get((task, rnd, p), []) if s.error is None]
            out[(task, j)] = Start(history=history, first_turn=(rnd + 1) * beam.turns_per_round,
                                   round=rnd + 1, parent=p)
    return out


def beam_metrics(samples: list[Sample], beam: BeamConfig, ks: Iterable[int],
                 fast_ps: Iterable[float]) -> dict[str, float]:
    """Per budget b: ``eval/beam/<m>/budget_<b>`` for each of eval_metrics.summarize's metrics
    over the ``width`` trajectories of that round (one attempt each: its lineage's fastest
    correct kernel; ``best_speedup`` is the mean over tasks of the best speedup, 0 where nothing
    is correct, ``best_correct`` the share of tasks solved), ``median_best_speedup``, and
    ``best_score`` (mean over tasks of the top turn score in any lineage)."""
    bests = lineage_bests(samples)
    tasks = sorted({s.task_id for s in samples})
    out: dict[str, float] = {}
    for rnd in range(beam.rounds):
        budget = (rnd + 1) * beam.turns_per_round
        rows = []
        for task in tasks:
            for j in range(beam.width):
                b = bests.get((task, rnd, j), Best())
                rows.append((task, b.correct, b.speedup if b.correct else None))
        for key, val in summarize(rows, list(ks), list(fast_ps)).items():
            name = key.replace("eval/", "eval/beam/", 1)
            out[name if key in ("eval/tasks", "eval/attempts_per_task") else f"{name}/budget_{budget}"] = val
        per_task = [max((s or 0.0) for t, _, s in rows if t == task) for task in tasks]
        out[f"eval/beam/median_best_speedup/budget_{budget}"] = (
            float(statistics.median(per_task)) if per_task else 0.0)
        top_scores = [max(bests.get((task, rnd, j), Best()).score for j in range(beam.width))
                      for task in tasks]
        out[f"eval/beam/best_score/budget_{budget}"] = (
            float(statistics.mean(top_scores)) if top_scores else 0.0)
    out["eval/samples"] = float(len(samples))
    return out


async def beam_search(generate: Callable[[Starts | None], AsyncIterator[Sample]],
                      task_ids: list[str], beam: BeamConfig) -> list[Sample]:
    """All rounds' Samples; ``generate(starts)`` runs one round of ``width`` x
    ``turns_per_round`` per task (round 0 with ``starts=None``), e.g. SamplerGroup.generate."""
    samples: list[Sample] = []
    starts: dict[tuple[str, int], Start] = {}
    for rnd in range(beam.rounds):
        async for s in generate(starts or None):
            samples.append(s)
        if rnd + 1 < beam.rounds:
            starts = next_starts(samples, starts, task_ids, rnd, beam)
    return samples
