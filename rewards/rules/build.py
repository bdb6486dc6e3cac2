"""Build-argument rule: the compiler and linker arguments an answer gives ``load_inline`` / ``load``
must pass the sandbox's own allowlist (:func:`sandbox.flags.check_build_call`), which the sandbox
enforces again at build time. Checked here on the literal arguments, so the policy hears the reason
before any build; arguments that are not literals are left to the sandbox."""
from __future__ import annotations

import ast
import functools
import inspect
from typing import Any

from rewards.rules.analysis import LOAD_INLINE, Answer
from rewards.rules.base import RuleSettings, calls_in, line_of
from sandbox.flags import DENIED_ARGUMENTS, check_build_call

_JUDGED = ("name", "extra_cflags", "extra_cuda_cflags", "extra_ldflags") + DENIED_ARGUMENTS
_UNKNOWN = object()


@functools.cache
def _parameters(which: str) -> tuple[str, ...]:
    """Positional parameter names of torch's load_inline / load (from torch, so they stay in step)."""
    from torch.utils import cpp_extension

    sig = inspect.signature(getattr(cpp_extension, which))
    return tuple(p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _module_literals(a: Answer) -> dict[str, Any]:
    """Module-level names bound exactly once, to a literal (``FLAGS = ["-O3"]``)."""
    memo = a.memo.get("module_literals")
    if memo is not None:
        return memo
    counts: dict[str, int] = {}
    values: dict[str, Any] = {}
    for node in ast.walk(a.tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    counts[n.id] = counts.get(n.id, 0) + 1
    for node in a.tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
    memo = a.memo["module_literals"] = {k: v for k, v in values.items() if counts.get(k) == 1}
    return memo


def _literal(a: Answer, node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Name):
        return _module_literals(a).get(node.id, _UNKNOWN)
    if isinstance(node, (ast.List, ast.Tuple)):  # a list mixing literals and literal names
        items = [_literal(a, el) for el in node.elts]
        if all(v is not _UNKNOWN for v in items) and not any(isinstance(el, ast.Starred) for el in node.elts):
            return items
    return _UNKNOWN


def _build_calls(a: Answer) -> list[tuple[ast.Call, str]]:
    out = []
    for c in calls_in([a.tree]):
        name = a.call_name(c)
        if name in LOAD_INLINE:
            out.append((c, name.rsplit(".", 1)[1]))
        elif name is None and isinstance(c.func, ast.Name) and c.func.id == "load_inline":
            out.append((c, "load_inline"))
    return out


def check_build_arguments(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for call, which in _build_calls(a):
        given: dict[str, Any] = {}
        for param, arg in zip(_parameters(which), call.args):
            if isinstance(arg, ast.Starred):
                break
            given[param] = arg
        given.update({k.arg: k.value for k in call.keywords if k.arg})
        literal = {k: v for k, v in ((k, _literal(a, n)) for k, n in given.items() if k in _JUDGED)
                   if v is not _UNKNOWN}
        for problem in check_build_call(literal):
            out.append(f"{line_of(call)}: {which}() {problem}")
    return out
