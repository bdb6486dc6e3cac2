"""Known-correct answers (``ModelNew``) for a few built-in tasks, per backend.

Files are named after the task id they solve (``level2/9_scale_shift_tanh_residual.py`` answers
``L2/9_scale_shift_tanh_residual``). Tests use them as answers that must score; the prompts never
show them.
"""
from __future__ import annotations

from pathlib import Path

SOLUTIONS_ROOT = Path(__file__).resolve().parent
BACKENDS = ("cpu", "triton", "cuda")


def solution_path(backend: str, task_id: str) -> Path:
    """Path of the reference answer for ``task_id`` ("L2/9_scale_shift_tanh_residual")."""
    level, stem = task_id.split("/", 1)
    return SOLUTIONS_ROOT / backend / f"level{level.lstrip('L')}" / f"{stem}.py"


def available(backend: str) -> list[str]:
    """Task ids with a reference answer for ``backend``, sorted."""
    root = SOLUTIONS_ROOT / backend
    return sorted(f"L{p.parent.name.removeprefix('level')}/{p.stem}" for p in root.glob("level*/*.py"))


def load_solution(backend: str, task_id: str) -> str:
    path = solution_path(backend, task_id)
    if not path.is_file():
        raise FileNotFoundError(f"no {backend} solution for {task_id} (looked for {path}); "
                                f"available: {', '.join(available(backend)) or 'none'}")
    return path.read_text()
