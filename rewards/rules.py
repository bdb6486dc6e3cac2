"""Anti-hack and format rules. Rules are data: a name, a description and a check.

A check takes the analysed answer (:class:`rewards.analysis.Answer`) and the rule settings and
returns human-readable reasons (empty = the answer passes). Any violation scores 0 and the rule
name is recorded (``hack/<rule>`` in the metrics). Checks are AST-based; a string search is used
only for code that lives in string literals (the C++/CUDA sources given to ``load_inline``).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rewards.analysis import LOAD_INLINE, TORCH_ALLOCATORS, VIEW_METHODS, Answer


@dataclass(frozen=True)
class RuleSettings:
    allowed_torch_calls: frozenset[str]      # dotted names; "prefix.*" allows a whole namespace
    allowed_tensor_methods: frozenset[str]   # method names allowed on tensors in forward (and in C++)
    allowed_extension_calls: frozenset[str]  # torch::/at:: names C++/CUDA sources may call; "ns::*" too

    @classmethod
    def from_config(cls, rules_cfg: Any) -> "RuleSettings":
        return cls(frozenset(rules_cfg.allowed_torch_calls), frozenset(rules_cfg.allowed_tensor_methods),
                   frozenset(rules_cfg.allowed_extension_calls))

    def torch_call_allowed(self, name: str) -> bool:
        return _allowed(name, self.allowed_torch_calls, ".")

    def extension_call_allowed(self, name: str) -> bool:
        return _allowed(name, self.allowed_extension_calls, "::")


def _allowed(name: str, allowed: frozenset[str], sep: str) -> bool:
    if name in allowed:
        return True
    star = f"{sep}*"
    return any(p.endswith(star) and name.startswith(p[:-1]) for p in allowed)


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    check: Callable[[Answer, RuleSettings], list[str]]


@dataclass(frozen=True)
class Violation:
    rule: str
    reason: str


def _line(node: ast.AST) -> str:
    return f"line {getattr(node, 'lineno', '?')}"


def _calls(nodes: Iterable[ast.AST]) -> Iterable[ast.Call]:
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Call):
                yield node


# ---------------------------------------------------------------- format rules
def _check_model_new(a: Answer, s: RuleSettings) -> list[str]:
    if a.model_new is not None:
        return []
    bound = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in n.targets)
                for n in a.tree.body)
    return [] if bound else ["no class ModelNew is defined at module level"]


def _load_inline_calls(a: Answer) -> list[ast.Call]:
    return [c for c in _calls([a.tree]) if a.call_name(c) in LOAD_INLINE
            or (isinstance(c.func, ast.Name) and c.func.id == "load_inline")]


def _has_arg(call: ast.Call, name: str, position: int) -> bool:
    if any(k.arg == name for k in call.keywords):
        return True
    return len(call.args) > position


def _check_kernel(a: Answer, s: RuleSettings) -> list[str]:
    missing = _kernel_missing(a)
    if missing or a.model_new is None or "forward" not in a.methods(a.model_new):
        return missing
    if not any(a.is_kernel_call(c) for c in _calls(a.forward_scope())):
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


# ---------------------------------------------------------------- compute in forward
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
        for _ in range(2):  # two passes settle straight-line code and simple loops
            for node in ast.walk(fn):
                value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
                if value is not None and self.is_tensor(value):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        for n in ast.walk(t):
                            if isinstance(n, ast.Name):
                                self.names.add(n.id)

    def is_tensor(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.names
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr in self.params
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                isinstance(node.value.value, ast.Name) and node.value.value.id == "self":
            return node.value.attr in self.layers and node.attr in ("weight", "bias")
        if isinstance(node, ast.Subscript):
            return self.is_tensor(node.value)
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
        return [self.bind(call) for call in _calls([fn]) if self.local_callee(call.func) is not None]


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


def _is_extension(a: Answer, node: ast.AST) -> bool:
    return a.is_extension_expr(node)


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
                reasons.append(f"{_line(node)}: tensor arithmetic ({type(node.op).__name__}) in {where}")
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, _ARITH) and tensors.is_tensor(node.target):
                reasons.append(f"{_line(node)}: in-place tensor arithmetic in {where}")
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY) and tensors.is_tensor(node.operand):
                reasons.append(f"{_line(node)}: unary tensor operation in {where}")
            elif isinstance(node, ast.Compare) and any(isinstance(op, _ORDER) for op in node.ops) and \
                    any(tensors.is_tensor(x) for x in [node.left, *node.comparators]):
                reasons.append(f"{_line(node)}: tensor comparison in {where}")
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Subscript) and tensors.is_tensor(t.value) for t in targets):
                    reasons.append(f"{_line(node)}: indexed write into a tensor (a torch copy/fill) in {where}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _TENSOR_BUILTINS \
                    and node.func.id not in a.aliases and node.func.id not in a.functions and \
                    any(tensors.is_tensor(x) for x in node.args):
                reasons.append(f"{_line(node)}: builtin {node.func.id}() computes on a tensor in {where}")
    return reasons


def _check_torch_compute(a: Answer, s: RuleSettings) -> list[str]:
    cls = a.model_new
    scope = a.forward_scope()
    if cls is None or not scope:
        return []
    reasons: list[str] = []
    layers = a.layer_attrs(cls)
    for call in _calls(scope):
        name = a.call_name(call)
        if name is not None and name.split(".")[0] == "torch":
            if not s.torch_call_allowed(name):
                reasons.append(f"{_line(call)}: {name}(...) computes with torch instead of the kernel")
            continue
        layer = _layer_call(call.func, layers)
        if layer is not None:
            reasons.append(f"{_line(call)}: calls the torch.nn layer self.{layer} in forward")
            continue
        if name is not None and (name.startswith("operator.") or name == "functools.reduce"):
            reasons.append(f"{_line(call)}: {name}(...) applies a tensor operator")
            continue
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr.startswith("__") and f.attr.endswith("__") and \
                f.attr not in ("__init__", "__len__") and a.dotted(f.value) is None:
            reasons.append(f"{_line(call)}: calls the dunder method .{f.attr}() (tensor compute)")
            continue
        if isinstance(f, ast.Attribute) and f.attr in COMPUTE_METHODS and f.attr not in s.allowed_tensor_methods:
            receiver = f.value
            if a.dotted(receiver) is None and not _is_extension(a, receiver):
                reasons.append(f"{_line(call)}: tensor method .{f.attr}() computes with torch")
    for root in scope:
        for node in ast.walk(root):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) or \
                    isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
                reasons.append(f"{_line(node)}: the @ operator is a torch matmul")
    forward = a.methods(cls).get("forward")
    if forward is not None:
        args = forward.args
        seeds = {x.arg for x in args.posonlyargs + args.args + args.kwonlyargs if x.arg != "self"}
        if args.vararg:
            seeds.add(args.vararg.arg)
        reasons += _tensor_arithmetic(a, forward, seeds)
    return reasons


# ---------------------------------------------------------------- compute inside C++/CUDA sources
_CPP_NAMESPACED_CALL = re.compile(r"\b((?:torch|at)(?:::\w+)+)\s*(?:<[^<>;()]*>)?\s*\(")
_CPP_METHOD_CALL = re.compile(r"\.\s*(\w+)\s*(?:<[^<>;()]*>)?\s*\(")
_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _extension_sources(a: Answer) -> list[str]:
    """String constants that are C++/CUDA code (what load_inline compiles)."""
    marks = ("#include", "torch::", "at::", "__global__", "PYBIND11", "TORCH_LIBRARY")
    return [t for t in a.string_constants() if any(m in t for m in marks)]


def _check_extension_compute(a: Answer, s: RuleSettings) -> list[str]:
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


# ---------------------------------------------------------------- structure hacks
def _check_try_except(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for node in ast.walk(a.tree):
        if isinstance(node, ast.Try) and node.handlers or type(node).__name__ == "TryStar":
            out.append(f"{_line(node)}: try/except can hide a failing kernel behind a fallback")
    return out


def _check_inherits_reference(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    cls = a.model_new
    if cls is not None:
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            if name == "Model":
                out.append(f"{_line(base)}: ModelNew subclasses the reference Model")
            elif isinstance(base, ast.Name) and base.id in a.classes and base.id != "ModelNew":
                inner = a.classes[base.id]
                if any(getattr(b, "id", getattr(b, "attr", "")) == "Model" for b in inner.bases):
                    out.append(f"{_line(base)}: ModelNew subclasses the reference Model through {base.id}")
    for node in a.tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in node.targets):
            if isinstance(node.value, ast.Name) and node.value.id == "Model":
                out.append(f"{_line(node)}: ModelNew is the reference Model")
    return out


_PROCESS_MODULES = {"threading", "_thread", "multiprocessing", "concurrent", "subprocess", "pty",
                    "torch.multiprocessing", "asyncio", "sched"}
_PROCESS_CALLS = re.compile(r"^os\.(system|popen|fork|forkpty|spawn\w*|exec\w*|posix_spawn\w*|kill|killpg)$")


def _imported_modules(a: Answer) -> Iterable[tuple[ast.AST, str]]:
    for node in ast.walk(a.tree):
        if isinstance(node, ast.Import):
            for al in node.names:
                yield node, al.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node, node.module
            for al in node.names:
                yield node, f"{node.module}.{al.name}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node, node.args[0].value


def _module_hits(a: Answer, banned: set[str]) -> list[tuple[ast.AST, str]]:
    hits = []
    for node, mod in _imported_modules(a):
        if any(mod == b or mod.startswith(b + ".") for b in banned):
            hits.append((node, mod))
    return hits


def _check_processes(a: Answer, s: RuleSettings) -> list[str]:
    out = [f"{_line(n)}: imports {m}" for n, m in _module_hits(a, _PROCESS_MODULES)]
    for call in _calls([a.tree]):
        name = a.call_name(call) or ""
        if _PROCESS_CALLS.match(name):
            out.append(f"{_line(call)}: {name}() starts or signals processes")
    return out


_STREAM_CALLS = {"torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.ExternalStream",
                 "torch.Stream", "torch.cuda.streams.Stream"}
_STREAM_TEXT = re.compile(r"\b(cudaStreamCreate\w*|getStreamFromPool|cudaStreamPerThread|cudaStreamNonBlocking|"
                          r"cudaLaunchHostFunc|cudaGraphLaunch)\b")


def _check_streams(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for call in _calls([a.tree]):
        name = a.call_name(call)
        if name in _STREAM_CALLS:
            out.append(f"{_line(call)}: {name}(...) runs work outside the timed stream")
    for text in a.string_constants():
        for m in _STREAM_TEXT.finditer(text):
            out.append(f"kernel source uses {m.group(1)}: work outside the timed stream")
    return out


def _check_monkey_patching(a: Answer, s: RuleSettings) -> list[str]:
    out = []

    def shared(target: ast.AST) -> str | None:
        root = target
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if isinstance(root, ast.Name) and (root.id in a.modules or root.id in ("__builtins__", "builtins")) \
                and root is not target:
            return ast.unparse(target)
        return None

    for node in ast.walk(a.tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                name = shared(el)
                if name:
                    out.append(f"{_line(node)}: rebinds {name} (patching a module or library object)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args and isinstance(node.args[0], (ast.Name, ast.Attribute)):
            root = _root_of(node.args[0])
            if root in a.modules or root in ("__builtins__", "builtins"):
                out.append(f"{_line(node)}: {node.func.id}() on {ast.unparse(node.args[0])} patches a library")
    return out


def _root_of(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


_NET_MODULES = {"socket", "urllib", "urllib3", "requests", "http", "httpx", "aiohttp", "ftplib", "smtplib",
                "telnetlib", "paramiko", "websocket", "websockets", "shutil", "tempfile", "pickle", "ssl"}
_FILE_CALLS = re.compile(r"^(io\.open|os\.(open|remove|unlink|rename|replace|makedirs|mkdir|rmdir|removedirs|"
                         r"chmod|chown|symlink|link|truncate|write|listdir|scandir|walk)|codecs\.open|"
                         r"torch\.(save|load)|numpy\.(save|savez|load|fromfile|memmap)|pathlib\.Path)$")
_PATH_METHODS = {"write_text", "write_bytes", "read_text", "read_bytes", "open", "unlink", "touch", "mkdir",
                 "rename", "replace", "rmdir", "iterdir", "glob", "rglob", "symlink_to"}


def _check_file_or_network(a: Answer, s: RuleSettings) -> list[str]:
    out = [f"{_line(n)}: imports {m}" for n, m in _module_hits(a, _NET_MODULES)]
    for call in _calls([a.tree]):
        f = call.func
        name = a.call_name(call) or ""
        if isinstance(f, ast.Name) and f.id == "open" and "open" not in a.aliases:
            out.append(f"{_line(call)}: open() reads or writes files")
        elif _FILE_CALLS.match(name):
            out.append(f"{_line(call)}: {name}() touches the file system")
        elif isinstance(f, ast.Attribute) and f.attr in _PATH_METHODS and _is_pathlike(a, f.value):
            out.append(f"{_line(call)}: .{f.attr}() on a path touches the file system")
    return out


def _is_pathlike(a: Answer, node: ast.AST) -> bool:
    """``Path(...)``, ``Path(...).parent / "x"`` or a name bound to one (pathlib objects touch files)."""
    while isinstance(node, (ast.Attribute, ast.BinOp, ast.Subscript)):
        node = node.left if isinstance(node, ast.BinOp) else node.value
    if isinstance(node, ast.Call):
        return (a.call_name(node) or "").startswith("pathlib.")
    if isinstance(node, ast.Name):
        paths = a.memo.get("path_names")
        if paths is None:
            paths = a.memo["path_names"] = {
                t.id for n in ast.walk(a.tree) if isinstance(n, ast.Assign) and _is_pathlike(a, n.value)
                for t in n.targets if isinstance(t, ast.Name)}
        return node.id in paths
    return False


def _check_environment(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for node in ast.walk(a.tree):
        if isinstance(node, (ast.Attribute, ast.Name)):
            name = a.dotted(node)
            if name in ("os.environ", "os.environb", "os.getenv", "os.putenv", "os.unsetenv", "posix.environ"):
                # report the outermost use only once per line
                out.append(f"{_line(node)}: {name} reads or changes the environment (secrets live there)")
    return sorted(set(out))


_REFERENCE_MODULES = {"__main__", "importlib", "runpy", "gc", "inspect", "sys", "builtins", "ctypes"}
_REFERENCE_NAME = re.compile(r"(^|\.)(ref|reference|task|problem)(_\w+)?$")


def _check_reference_access(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for node, mod in _imported_modules(a):
        top = mod.split(".")[0]
        if top in _REFERENCE_MODULES and not mod.startswith("sys.") or _REFERENCE_NAME.search(mod):
            out.append(f"{_line(node)}: imports {mod}, which can reach the reference or the harness")
        elif mod in ("sys.modules", "sys._getframe"):
            out.append(f"{_line(node)}: imports {mod}")
    for node in ast.walk(a.tree):
        if isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
            out.append(f"{_line(node)}: uses the reference class Model")
        elif isinstance(node, ast.Name) and node.id in ("get_inputs", "get_init_inputs", "globals", "vars") \
                and isinstance(node.ctx, ast.Load):
            out.append(f"{_line(node)}: uses {node.id}, which belongs to the harness")
        elif isinstance(node, ast.Attribute) and node.attr in ("modules", "_getframe", "f_back", "f_globals",
                                                               "f_locals", "__subclasses__", "__globals__"):
            out.append(f"{_line(node)}: .{node.attr} reaches outside the answer")
    return sorted(set(out))


_DYNAMIC_CALLS = {"eval", "exec", "compile", "__import__", "breakpoint"}


def _check_dynamic_code(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for node in ast.walk(a.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            fn = node.func.id
            if fn in _DYNAMIC_CALLS and fn not in a.aliases and fn not in a.functions:
                out.append(f"{_line(node)}: {fn}() runs code these checks cannot see")
            elif fn in ("getattr", "hasattr") and node.args and a.dotted(node.args[0]) is not None:
                out.append(f"{_line(node)}: {fn}() on {ast.unparse(node.args[0])} looks names up dynamically")
        elif isinstance(node, ast.ImportFrom) and any(al.name == "*" for al in node.names):
            out.append(f"{_line(node)}: 'from {node.module} import *' hides which names are used")
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            out.append(f"{_line(node)}: __builtins__ reaches the interpreter")
    return out


RULES: dict[str, Rule] = {r.name: r for r in [
    Rule("no_model_new", "The answer must define class ModelNew.", _check_model_new),
    Rule("no_kernel", "The answer must contain a kernel for its backend (cuda: __global__ + load_inline; "
         "triton: @triton.jit; cpu: C++ through load_inline) and ModelNew.forward must call it.", _check_kernel),
    Rule("torch_compute_in_forward", "ModelNew.forward and the helpers it calls may allocate and reshape "
         "tensors but must not compute with torch ops, torch.nn layers, torch.nn.functional, tensor "
         "methods or tensor arithmetic.", _check_torch_compute),
    Rule("torch_compute_in_extension", "The C++/CUDA sources may allocate tensors and query their shape but "
         "must not call ATen/torch compute (torch::matmul, at::softmax, x.sum(), ...).", _check_extension_compute),
    Rule("try_except", "No try/except: a fallback would hide a failing kernel.", _check_try_except),
    Rule("inherits_reference", "ModelNew must not subclass or alias the reference Model.",
         _check_inherits_reference),
    Rule("threads_or_processes", "No threads, process pools, subprocesses or os.system.", _check_processes),
    Rule("cuda_streams", "No extra CUDA streams or graphs: all work must run on the timed stream.",
         _check_streams),
    Rule("monkey_patching", "No rebinding of library or module attributes (timers, torch functions, "
         "CUDA events).", _check_monkey_patching),
    Rule("file_or_network", "No file or network access (open, sockets, HTTP, pathlib writes, "
         "torch.save/load).", _check_file_or_network),
    Rule("environment_access", "No reading or changing environment variables.", _check_environment),
    Rule("dynamic_code", "No eval/exec/compile/__import__, getattr on modules or star imports: they hide "
         "code from these checks.", _check_dynamic_code),
    Rule("reference_access", "No use of the reference Model, the harness's inputs, or the interpreter's "
         "internals (sys.modules, frames, gc, importlib, __main__).", _check_reference_access),
]}


def check_rules(code: str, backend: str, enabled: Sequence[str], settings: RuleSettings,
                max_reasons: int = 3) -> list[Violation]:
    """All violations of the enabled rules, in rule order. ``code`` must be valid Python."""
    unknown = [n for n in enabled if n not in RULES]
    if unknown:
        raise ValueError(f"unknown rule(s) {unknown} in reward.rules.enabled; known: {', '.join(RULES)}")
    answer = Answer.from_source(code, backend)
    out: list[Violation] = []
    for name in RULES:
        if name in enabled:
            for reason in RULES[name].check(answer, settings)[:max_reasons]:
                out.append(Violation(name, reason))
    return out
