"""Loaders for KernelBench-style task trees (``levelN/ID_Name.py``) and the train/holdout split."""
from __future__ import annotations

import logging
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from rewards.tasks.reference import check_reference
from rewards.tasks.source import apply_profile
from rewards.tasks.task import Task, TaskError

log = logging.getLogger(__name__)

BUILTIN_ROOT = Path(__file__).resolve().parent / "builtin"
_FILE_RE = re.compile(r"^(\d+)_(.+)\.py$")


def _level_dir(root: Path, level: int) -> Path:
    for candidate in (root / f"level{level}", root / "KernelBench" / f"level{level}"):
        if candidate.is_dir():
            return candidate
    raise TaskError(f"{root}: no level{level}/ directory (nor KernelBench/level{level}/); expected a "
                    "KernelBench-style checkout with levelN/ID_Name.py files")


def load_task_file(path: str | Path, level: int, profile: str = "full", check: bool = False) -> Task:
    """One task file -> Task. Raises TaskError naming the file on any problem."""
    path = Path(path)
    m = _FILE_RE.match(path.name)
    if not m:
        raise TaskError(f"{path}: file name must look like ID_Name.py (e.g. 12_softmax.py)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read task file ({e})") from None
    source = apply_profile(text, str(path), profile)
    task = Task(id=f"L{level}/{path.stem}", name=m.group(2), level=level, problem_id=int(m.group(1)),
                source=source, path=str(path), profile=profile)
    if check:
        check_reference(task)
    return task


def load_kernelbench(root: str | Path, levels: Iterable[int] = (1, 2), profile: str = "full",
                     skip_invalid: bool = False, check: bool = False) -> list[Task]:
    """Tasks of ``levels`` under ``root``, level by level, sorted by integer id within a level.

    ``check`` also runs every reference once (on CPU) so that a forward that raises is caught at
    load time. ``skip_invalid`` turns a bad file into a warning instead of an error.
    """
    root = Path(root)
    if not root.is_dir():
        raise TaskError(f"task root {root} is not a directory; expected a KernelBench-style checkout")
    tasks: list[Task] = []
    for level in sorted(set(levels)):
        files = []
        for p in _level_dir(root, level).iterdir():
            m = _FILE_RE.match(p.name)
            if m and p.is_file():
                files.append((int(m.group(1)), p))
            elif p.suffix == ".py" and p.name != "__init__.py":
                log.warning("ignoring %s: name is not ID_Name.py", p)
        files.sort(key=lambda f: (f[0], f[1].name))
        seen: dict[int, Path] = {}
        for number, p in files:
            if number in seen:
                err = TaskError(f"{p}: problem id {number} already used by {seen[number].name} in level{level}")
                if not skip_invalid:
                    raise err
                log.warning("skipping invalid task: %s", err)
                continue
            try:
                tasks.append(load_task_file(p, level, profile=profile, check=check))
                seen[number] = p
            except TaskError as e:
                if not skip_invalid:
                    raise
                log.warning("skipping invalid task: %s", e)
    if profile == "cpu":
        unsized = [t.id for t in tasks if "CPU_SIZES" not in Path(t.path).read_text()]
        if unsized:
            log.warning("profile 'cpu': %d task(s) under %s declare no CPU_SIZES and keep their full sizes "
                        "(e.g. %s)", len(unsized), root, ", ".join(unsized[:3]))
    return tasks


def load_builtin(levels: Iterable[int] = (1, 2), profile: str = "full", skip_invalid: bool = False,
                 check: bool = False) -> list[Task]:
    """The task set shipped with the project (rewards/tasks/builtin)."""
    return load_kernelbench(BUILTIN_ROOT, levels=levels, profile=profile, skip_invalid=skip_invalid,
                            check=check)


def split(tasks: Sequence[Task], holdout_frac: float, seed: int) -> tuple[list[Task], list[Task]]:
    """Deterministic (train, holdout) split, per level so both splits see every level.

    Each list keeps the input order. The same tasks, fraction and seed give the same split.
    """
    if not 0.0 <= holdout_frac < 1.0:
        raise ValueError(f"holdout_frac must be in [0, 1), got {holdout_frac}")
    held: set[str] = set()
    for level in sorted({t.level for t in tasks}):
        ids = sorted(t.id for t in tasks if t.level == level)
        rng = random.Random(f"{seed}/L{level}")
        rng.shuffle(ids)
        held.update(ids[:round(len(ids) * holdout_frac)])
    return [t for t in tasks if t.id not in held], [t for t in tasks if t.id in held]
