"""Format rules: the answer defines ModelNew and a kernel for its backend, and forward calls it."""
from __future__ import annotations

import ast

from rewards.rules.analysis import LOAD_INLINE, Answer
from rewards.rules.base import RuleSettings, calls_in


def check_model_new(a: Answer, s: RuleSettings) -> list[str]:
    if a.model_new is not None:
        return []
    bound = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in n.targets)
                for n in a.tree.body)
    return [] if bound else ["no class ModelNew is defined at module level"]


def _load_inline_calls(a: Answer) -> list[ast.Call]:
    return [c for c in calls_in([a.tree]) if a.call_name(c) in LOAD_INLINE
            or (isinstance(c.func, ast.Name) and c.func.id == "load_inline")]


def _has_arg(call: ast.Call, name: str, position: int) -> bool:
    if any(k.arg == name for k in call.keywords):
        return True
    return len(call.args) > position


def check_kernel(a: Answer, s: RuleSettings) -> list[str]:
    missing = _kernel_missing(a)
    if missing or a.model_new is None or "forward" not in a.methods(a.model_new):
        return missing
    if not any(a.is_kernel_call(c) for c in calls_in(a.forward_scope())):
        return ["ModelNew.forward never calls the compiled kernel (directly or through a helper)"]
    return []


def _kernel_missing(a: Answer) -> list[str]:
    inline = _load_inline_calls(a)
    if a.backend == "cuda":
        has_global = any("__global__" in t for t in a.string_constants())
        has_cuda_build = any(_has_arg(c, "cuda_sources", 2) for c in inline)
        if has_global and has_cuda_build:
            return []
        return ["the cuda backend needs a __global__ kernel compiled with load_inline(cuda_sources=...)"]
    if a.backend == "triton":
        return [] if a.kernels else ["the triton backend needs a @triton.jit kernel"]
    if a.backend == "cpu":
        if any(_has_arg(c, "cpp_sources", 1) for c in inline):
            return []
        return ["the cpu backend needs C++ code compiled with torch.utils.cpp_extension.load_inline(cpp_sources=...)"]
    return [f"unknown backend {a.backend!r}"]
