"""Run a task's reference once in this process: task files are trusted, candidates are not."""
from __future__ import annotations

import types
from typing import Any

import torch

from rewards.tasks.task import Task, TaskError


def load_module(task: Task) -> types.ModuleType:
    """Execute the task source as a fresh module (no sys.modules entry, nothing cached)."""
    module = types.ModuleType(f"kernel_task_{task.level}_{task.problem_id}")
    module.__file__ = task.path
    try:
        exec(compile(task.source, task.path, "exec"), module.__dict__)
    except Exception as e:  # a broken task file, reported with its name
        raise TaskError(f"{task.path}: importing the task raised {type(e).__name__}: {e}") from e
    return module


def check_reference(task: Task, seed: int = 0) -> Any:
    """Build ``Model(*get_init_inputs())`` and run it on ``get_inputs()``; return the output.

    Raises TaskError naming the file and the step that failed.
    """
    module = load_module(task)
    torch.manual_seed(seed)
    step = "get_init_inputs()"
    try:
        init_inputs = module.get_init_inputs()
        step = "Model(*get_init_inputs())"
        model = module.Model(*init_inputs)
        step = "get_inputs()"
        inputs = module.get_inputs()
        step = "Model.forward(*get_inputs())"
        with torch.no_grad():
            out = model(*inputs)
    except Exception as e:
        raise TaskError(f"{task.path}: {step} raised {type(e).__name__}: {e}") from e
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
        raise TaskError(f"{task.path}: Model.forward must return a tensor or a tuple of tensors, "
                        f"got {type(out).__name__}")
    return out
