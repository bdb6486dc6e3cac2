"""Static checks of a task source and the size-profile rewrite.

A built-in task declares its sizes as module-level constants plus ``CPU_SIZES = {"NAME": value}``.
For profile ``cpu`` those assignments are rewritten in place, so the result is still one valid,
standalone file that the model can read and the sandbox can run. The ``CPU_SIZES`` line itself is
dropped from every profile: it is loader metadata, not part of the problem.
"""
from __future__ import annotations

import ast

from rewards.tasks.task import TaskError

PROFILES = ("full", "cpu")
REQUIRED_CLASSES = ("Model",)
REQUIRED_FUNCTIONS = ("get_inputs", "get_init_inputs")
_SIZES_NAME = "CPU_SIZES"


def parse_task_source(source: str, path: str) -> ast.Module:
    """Parse and check the KernelBench shape; raise TaskError naming ``path`` otherwise."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        raise TaskError(f"{path}: not valid Python (line {e.lineno}: {e.msg}); "
                        "expected a KernelBench task file") from None
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    missing = [f"class {c}" for c in REQUIRED_CLASSES if c not in classes]
    missing += [f"def {f}()" for f in REQUIRED_FUNCTIONS if f not in functions]
    if missing:
        raise TaskError(f"{path}: missing {', '.join(missing)}; a task must define class Model(nn.Module), "
                        "get_inputs() and get_init_inputs() at module level")
    return tree


def _assigned(node: ast.stmt) -> str | None:
    """The name a module-level ``NAME = ...`` statement sets (None for any other statement)."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def _sizes_node(tree: ast.Module) -> ast.Assign | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and _assigned(node) == _SIZES_NAME:
            return node
    return None


def _cpu_sizes(node: ast.Assign, path: str) -> dict[str, object]:
    try:
        sizes = ast.literal_eval(node.value)
    except ValueError:
        sizes = None
    if not isinstance(sizes, dict) or not all(isinstance(k, str) for k in sizes):
        raise TaskError(f"{path}: {_SIZES_NAME} must be a literal dict of constant name -> value")
    return sizes


def apply_profile(source: str, path: str, profile: str) -> str:
    """The task text for ``profile``: sizes substituted for ``cpu``, ``CPU_SIZES`` removed."""
    if profile not in PROFILES:
        raise TaskError(f"unknown size profile {profile!r}; expected one of {', '.join(PROFILES)}")
    tree = parse_task_source(source, path)
    sizes_node = _sizes_node(tree)
    if sizes_node is None:
        return source  # e.g. a KernelBench file: one size only
    sizes = _cpu_sizes(sizes_node, path) if profile == "cpu" else {}
    return _rewrite(source, tree, sizes, path, _SIZES_NAME, drop=sizes_node)


def resize(source: str, path: str, sizes: dict[str, int], what: str = "reward.sizes") -> str:
    """The task text with the module-level constants ``sizes`` names set to its values (e.g.
    KernelBench's ``dim = 393216`` -> ``dim = 16384``); ``what`` names the setting in errors."""
    return _rewrite(source, parse_task_source(source, path), sizes, path, what)


def constants(source: str) -> set[str]:
    """Names of the module-level ``NAME = ...`` assignments of a task source: what :func:`resize`
    can set (``dim = 393216`` and ``N = 2048 * 2`` alike)."""
    return {name for name in map(_assigned, ast.parse(source).body) if name is not None}


def _rewrite(source: str, tree: ast.Module, sizes: dict[str, object], path: str, what: str,
             drop: ast.Assign | None = None) -> str:
    """``source`` with each module-level assignment to a name of ``sizes`` replaced by its value,
    and the ``drop`` node (with a comment line about CPU sizes just above it) removed."""
    lines = source.splitlines(keepends=True)
    replaced: dict[int, str] = {}   # 0-based first line -> new text (covering the node's lines)
    spans: list[tuple[int, int]] = []
    assigned = set()
    for node in tree.body:
        if node is drop:
            start = node.lineno - 1
            # the comment line explaining CPU_SIZES belongs to it
            if start > 0 and lines[start - 1].lstrip().startswith("#") and "cpu" in lines[start - 1].lower():
                start -= 1
            spans.append((start, node.end_lineno))
            replaced[start] = ""
        elif (name := _assigned(node)) in sizes:
            assigned.add(name)
            spans.append((node.lineno - 1, node.end_lineno))
            replaced[node.lineno - 1] = f"{name} = {sizes[name]!r}\n"
    unknown = set(sizes) - assigned
    if unknown:
        raise TaskError(f"{path}: {what} names {sorted(unknown)} that are not module-level constants")
    out: list[str] = []
    skip_until = -1
    for i, line in enumerate(lines):
        if i < skip_until:
            continue
        span = next((s for s in spans if s[0] == i), None)
        if span is None:
            out.append(line)
        else:
            out.append(replaced[i])
            skip_until = span[1]
    return "".join(out)
