"""Known-correct answers (``ModelNew``) for built-in tasks, per backend: the ``fast`` answers of
the corpus (:mod:`rewards.corpus`). Tests use them as answers that must score; the prompts never
show them.
"""
from __future__ import annotations

from pathlib import Path

from rewards.corpus import corpus_answer, corpus_tasks, task_dir

BACKENDS = ("cpu", "triton", "cuda")


def solution_path(backend: str, task_id: str) -> Path:
    """Path of the reference answer for ``task_id`` ("L2/9_scale_shift_tanh_residual")."""
    return task_dir(backend, task_id) / "fast.py"


def available(backend: str) -> list[str]:
    """Task ids with a reference answer for ``backend``, sorted."""
    return [t for t in corpus_tasks(backend) if solution_path(backend, t).is_file()]


def load_solution(backend: str, task_id: str) -> str:
    """The answer's code, as :attr:`rewards.corpus.CorpusAnswer.code` (no final newline)."""
    path = solution_path(backend, task_id)
    if not path.is_file():
        raise FileNotFoundError(f"no {backend} solution for {task_id} (looked for {path}); "
                                f"available: {', '.join(available(backend)) or 'none'}")
    return corpus_answer(backend, task_id, "fast").code
