"""Kernel tasks in KernelBench's format: the built-in set, a loader for any checkout, the split."""
from rewards.tasks.loader import BUILTIN_ROOT, load_builtin, load_kernelbench, load_task_file, split
from rewards.tasks.reference import check_reference
from rewards.tasks.source import PROFILES, apply_profile
from rewards.tasks.task import Task, TaskError

__all__ = ["BUILTIN_ROOT", "PROFILES", "Task", "TaskError", "apply_profile", "check_reference",
           "load_builtin", "load_kernelbench", "load_task_file", "split"]
