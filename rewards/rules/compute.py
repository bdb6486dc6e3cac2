"""Compute rules: ModelNew.forward (and what it reaches) and the C++/CUDA sources must not let
torch do the work: no torch ops, nn layers, functional calls, tensor methods, tensor arithmetic,
and no ATen compute calls inside the extension sources."""
from __future__ import annotations

import ast
import re

import torch

from rewards.rules.analysis import TORCH_ALLOCATORS, VIEW_METHODS, Answer
from rewards.rules.base import RuleSettings, calls_in, line_of


# Tensor methods that have a torch.* counterpart compute something (x.sum(), x.matmul(y), x.exp()...).
COMPUTE_METHODS = frozenset(
    n for n in dir(torch.Tensor)
    if not n.startswith("_") and callable(getattr(torch, n, None)) and not isinstance(getattr(torch, n), type))
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd, ast.BitOr, ast.BitXor,
          ast.LShift, ast.RShift)
_UNARY = (ast.USub, ast.Invert)
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)
# builtins that compute on a tensor argument through its dunder methods (abs -> __abs__, sum -> __add__)
_TENSOR_BUILTINS = {"abs", "sum", "pow", "max", "min", "round", "divmod", "sorted", "map"}


class _TensorNames:
    """Which expressions of one function in forward's scope are tensors.

    Seeds: the parameters known to receive tensors (forward's inputs; a helper's parameters that
    forward passes tensors to), ``self`` parameters and layer weights. Propagates through
    assignments from allocations, views, extension calls and local helpers given tensors.
    """

    def __init__(self, a: Answer, fn: ast.FunctionDef, seeds: set[str]):
        cls = a.model_new
        self.a = a
        self.params = a.param_attrs(cls)
        self.layers = a.layer_attrs(cls)
        self.methods = a.methods(cls)
        self.names = set(seeds)
        self.self_attrs: set[str] = set()   # self.<attr> given a tensor in this function
        self.containers: set[str] = set()   # dicts/lists (names, "self.<attr>") given a tensor by index
        for _ in range(2):  # two passes settle straight-line code and simple loops
            for node in ast.walk(fn):
                value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
                if value is not None and self.is_tensor(value):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        self._bind(t)

    def _bind(self, target: ast.AST) -> None:
        """A tensor is stored into ``target``: the names it binds become tensors. A store into an
        index or an attribute (``out["y"] = ...``, ``self.buf = ...``) does not make the container
        or ``self`` a tensor; it makes ``out["y"]`` / ``self.buf`` read back as one."""
        if isinstance(target, ast.Name):
            self.names.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for el in target.elts:
                self._bind(el)
        elif isinstance(target, ast.Starred):
            self._bind(target.value)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            self.self_attrs.add(target.attr)
        elif isinstance(target, ast.Subscript) and not self.is_tensor(target.value):
            key = _container_key(target.value)
            if key is not None:
                self.containers.add(key)

    def is_tensor(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.names
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr in self.params or node.attr in self.self_attrs
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                isinstance(node.value.value, ast.Name) and node.value.value.id == "self":
            return node.value.attr in self.layers and node.attr in ("weight", "bias")
        if isinstance(node, ast.Subscript):
            return self.is_tensor(node.value) or _container_key(node.value) in self.containers
        if isinstance(node, ast.BinOp):
            return self.is_tensor(node.left) or self.is_tensor(node.right)
        if isinstance(node, ast.Call):
            name = self.a.call_name(node)
            if name in TORCH_ALLOCATORS:
                return True
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in VIEW_METHODS and self.is_tensor(f.value):
                return True
            if self.a.is_kernel_call(node):
                return True  # what a kernel returns is a tensor
            if self.local_callee(f) is not None:
                return self.returns_tensor(node)
        return False

    def returns_tensor(self, call: ast.Call) -> bool:
        """Whether a local helper returns a tensor when given these arguments (memoised per answer)."""
        callee, got = self.bind(call)
        memo: dict = self.a.memo.setdefault("returns_tensor", {})
        key = (id(callee), frozenset(got))
        if key not in memo:
            memo[key] = False  # while in progress (recursion) the answer is "no"
            inner = _TensorNames(self.a, callee, got)
            memo[key] = any(isinstance(n, ast.Return) and n.value is not None and inner.is_tensor(n.value)
                            for n in ast.walk(callee))
        return memo[key]

    def bind(self, call: ast.Call) -> tuple[ast.FunctionDef, set[str]]:
        """The helper a call reaches and which of its parameters receive tensors."""
        callee, is_method = self.local_callee(call.func)
        params = [p.arg for p in callee.args.posonlyargs + callee.args.args]
        if is_method and params:
            params = params[1:]
        got = {p for p, arg in zip(params, call.args) if self.is_tensor(arg)}
        got |= {k.arg for k in call.keywords if k.arg and self.is_tensor(k.value)}
        return callee, got

    def local_callee(self, func: ast.AST) -> tuple[ast.FunctionDef, bool] | None:
        """(definition, is_method) of a helper defined in this file, or None."""
        if isinstance(func, ast.Name) and func.id in self.a.functions and func.id not in self.a.kernels:
            return self.a.functions[func.id], False
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and func.attr in self.methods:
            return self.methods[func.attr], True
        return None

    def tensor_params_of_calls(self, fn: ast.FunctionDef) -> list[tuple[ast.FunctionDef, set[str]]]:
        """For every call from ``fn`` to a local helper: the helper's parameters that get tensors."""
        return [self.bind(call) for call in calls_in([fn]) if self.local_callee(call.func) is not None]


def _container_key(node: ast.AST) -> str | None:
    """``out`` -> "out", ``self.cache`` -> "self.cache"; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _layer_call(func: ast.AST, layers: set[str]) -> str | None:
    """``self.lin(x)``, ``self.lin.forward(x)``, ``self.blocks[0](x)`` -> "lin"."""
    if isinstance(func, ast.Attribute) and func.attr == "forward":
        func = func.value
    while isinstance(func, ast.Subscript):
        func = func.value
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
            and func.attr in layers:
        return func.attr
    return None


def _tensor_arithmetic(a: Answer, forward: ast.FunctionDef, seeds: set[str]) -> list[str]:
    """Arithmetic on tensors in forward and in every helper forward hands tensors to."""
    known: dict[int, set[str]] = {id(forward): set(seeds)}
    fns: dict[int, ast.FunctionDef] = {id(forward): forward}
    todo = [forward]
    while todo:  # grow each function's tensor parameters until nothing changes
        fn = todo.pop()
        for callee, got in _TensorNames(a, fn, known[id(fn)]).tensor_params_of_calls(fn):
            fns[id(callee)] = callee
            have = known.get(id(callee))
            if have is None or not got <= have:  # sets only grow: this ends
                known[id(callee)] = (have or set()) | got
                todo.append(callee)
    reasons = []
    for key, fn in fns.items():
        tensors = _TensorNames(a, fn, known[key])
        where = "forward" if fn is forward else f"{fn.name}()"
        for node in ast.walk(fn):
            if isinstance(node, ast.BinOp) and isinstance(node.op, _ARITH) and \
                    (tensors.is_tensor(node.left) or tensors.is_tensor(node.right)):
                reasons.append(f"{line_of(node)}: tensor arithmetic ({type(node.op).__name__}) in {where}")
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, _ARITH) and tensors.is_tensor(node.target):
                reasons.append(f"{line_of(node)}: in-place tensor arithmetic in {where}")
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY) and tensors.is_tensor(node.operand):
                reasons.append(f"{line_of(node)}: unary tensor operation in {where}")
            elif isinstance(node, ast.Compare) and any(isinstance(op, _ORDER) for op in node.ops) and \
                    any(tensors.is_tensor(x) for x in [node.left, *node.comparators]):
                reasons.append(f"{line_of(node)}: tensor comparison in {where}")
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Subscript) and tensors.is_tensor(t.value) for t in targets):
                    reasons.append(f"{line_of(node)}: indexed write into a tensor (a torch copy/fill) in {where}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _TENSOR_BUILTINS \
                    and node.func.id not in a.aliases and node.func.id not in a.functions and \
                    any(tensors.is_tensor(x) for x in node.args):
                reasons.append(f"{line_of(node)}: builtin {node.func.id}() computes on a tensor in {where}")
    return reasons


def check_torch_compute(a: Answer, s: RuleSettings) -> list[str]:
    cls = a.model_new
    scope = a.forward_scope()
    if cls is None or not scope:
        return []
    reasons: list[str] = []
    layers = a.layer_attrs(cls)
    for call in calls_in(scope):
        name = a.call_name(call)
        if name is not None and name.split(".")[0] == "torch":
            if not s.torch_call_allowed(name):
                reasons.append(f"{line_of(call)}: {name}(...) computes with torch instead of the kernel")
            continue
        layer = _layer_call(call.func, layers)
        if layer is not None:
            reasons.append(f"{line_of(call)}: calls the torch.nn layer self.{layer} in forward")
            continue
        if name is not None and (name.startswith("operator.") or name == "functools.reduce"):
            reasons.append(f"{line_of(call)}: {name}(...) applies a tensor operator")
            continue
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr.startswith("__") and f.attr.endswith("__") and \
                f.attr not in ("__init__", "__len__") and a.dotted(f.value) is None:
            reasons.append(f"{line_of(call)}: calls the dunder method .{f.attr}() (tensor compute)")
            continue
        if isinstance(f, ast.Attribute) and f.attr in COMPUTE_METHODS and f.attr not in s.allowed_tensor_methods:
            receiver = f.value
            if a.dotted(receiver) is None and not a.is_extension_expr(receiver):
                reasons.append(f"{line_of(call)}: tensor method .{f.attr}() computes with torch")
    for root in scope:
        for node in ast.walk(root):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) or \
                    isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
                reasons.append(f"{line_of(node)}: the @ operator is a torch matmul")
    forward = a.methods(cls).get("forward")
    if forward is not None:
        args = forward.args
        seeds = {x.arg for x in args.posonlyargs + args.args + args.kwonlyargs if x.arg != "self"}
        if args.vararg:
            seeds.add(args.vararg.arg)
        reasons += _tensor_arithmetic(a, forward, seeds)
    return reasons


_CPP_NAMESPACED_CALL = re.compile(r"\b((?:torch|at)(?:::\w+)+)\s*(?:<[^<>;()]*>)?\s*\(")
_CPP_METHOD_CALL = re.compile(r"\.\s*(\w+)\s*(?:<[^<>;()]*>)?\s*\(")
_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _extension_sources(a: Answer) -> list[str]:
    """String constants that are C++/CUDA code (what load_inline compiles)."""
    marks = ("#include", "torch::", "at::", "__global__", "PYBIND11", "TORCH_LIBRARY")
    return [t for t in a.string_constants() if any(m in t for m in marks)]


def check_extension_compute(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for text in _extension_sources(a):
        code = _CPP_COMMENT.sub("", text)
        for m in re.finditer(r"\busing\s+namespace\s+((?:torch|at)(?:::\w+)*)\s*;", code):
            out.append(f"kernel source has 'using namespace {m.group(1)}', which hides which ATen calls it makes")
        for m in _CPP_NAMESPACED_CALL.finditer(code):
            if not s.extension_call_allowed(m.group(1)):
                out.append(f"kernel source calls {m.group(1)}(): ATen computes, not your kernel")
        for m in _CPP_METHOD_CALL.finditer(code):
            if m.group(1) in COMPUTE_METHODS and m.group(1) not in s.allowed_tensor_methods:
                out.append(f"kernel source calls .{m.group(1)}() on a tensor: ATen computes, not your kernel")
    return list(dict.fromkeys(out))
