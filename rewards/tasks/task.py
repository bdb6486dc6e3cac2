"""A kernel task in KernelBench's format, and the error a bad task file raises."""
from __future__ import annotations

from dataclasses import dataclass


class TaskError(ValueError):
    """A task file that cannot be used; the message names the file and what was expected."""


@dataclass(frozen=True)
class Task:
    """One task: the reference source (with ``class Model``, ``get_inputs``, ``get_init_inputs``).

    ``source`` is the text for the chosen size profile; it is what the model sees and what the
    sandbox runs as the reference.
    """

    id: str            # "L1/12_softmax": level and file stem, unique within a task set
    name: str          # "softmax"
    level: int
    problem_id: int    # the integer before the first underscore of the file name
    source: str
    path: str
    profile: str = "full"
