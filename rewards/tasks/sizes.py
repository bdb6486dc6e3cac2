"""``reward.sizes``: a task set's problem sizes changed by name, task by task.

KernelBench's level-1 elementwise tasks take a 4096 x 393216 float tensor (6 GiB); one evaluation
of them needs ~51 GiB of GPU memory, more than an 80 GB GPU has left beside a vLLM engine and a
trainer. Kevin-32B trained on KernelBench's earlier, smaller sizes. An entry

    "L1/19_ReLU:dim=16384"            one task
    "L1/2*:batch_size=4096,dim=16384" every task whose id matches the pattern (fnmatch)

sets those module-level constants of the matched tasks' sources, so the model is prompted
with, and the sandbox runs, the task at that size. An entry that names one task must name
constants it assigns; a pattern changes, in each task it matches, the constants that task assigns,
and must change at least one task. Any other mistake is an error naming the entry.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence

from rewards.tasks.source import constants, resize
from rewards.tasks.task import Task, TaskError

_GLOB = set("*?[")


def parse_entry(entry: str, where: str = "reward.sizes") -> tuple[str, dict[str, int]]:
    """``"PATTERN:NAME=INT[,NAME=INT...]"`` -> (pattern, {name: value})."""
    pattern, sep, rest = str(entry).partition(":")
    sizes: dict[str, int] = {}
    for part in rest.split(",") if sep else []:
        name, eq, value = part.strip().partition("=")
        try:
            number = int(value.strip()) if eq else 0
        except ValueError:
            number = 0
        if not name.strip().isidentifier() or number < 1:
            sizes = {}
            break
        sizes[name.strip()] = number
    if not pattern.strip() or not sizes:
        raise TaskError(f"{where} entry {entry!r}: expected 'TASK_ID_OR_PATTERN:NAME=INT[,NAME=INT...]' "
                        "with positive integers, e.g. 'L1/19_ReLU:batch_size=4096,dim=16384'")
    return pattern.strip(), sizes


def resize_tasks(tasks: Sequence[Task], entries: Sequence[str], where: str = "reward.sizes") -> list[Task]:
    """``tasks`` with each entry's sizes applied (later entries win where two set one constant)."""
    parsed = [(e, *parse_entry(e, where)) for e in entries]
    out = list(tasks)
    for entry, pattern, sizes in parsed:
        glob = bool(_GLOB & set(pattern))
        changed = 0
        for i, task in enumerate(out):
            if not (fnmatch.fnmatchcase(task.id, pattern) if glob else task.id == pattern):
                continue
            names = sizes if not glob else {k: v for k, v in sizes.items() if k in constants(task.source)}
            if names:
                out[i] = dataclasses.replace(task, source=resize(task.source, task.path, names,
                                                                 f"{where} entry {entry!r}"))
                changed += 1
        if not changed:
            raise TaskError(f"{where} entry {entry!r}: changes no task (no task id matches {pattern!r}"
                            f"{'' if not glob else ' with a module-level constant ' + ' or '.join(sizes)})")
    return out
