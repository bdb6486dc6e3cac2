"""Static facts about a candidate answer that the anti-hack rules share (names, scopes, reachability).

Everything here is AST-based: import aliases resolved to dotted names (``F.gelu`` ->
``torch.nn.functional.gelu``), the functions reachable from ``ModelNew.forward``, the attributes
``__init__`` binds to torch.nn layers or parameters, and which local names hold tensors.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from rewards.parse import parse_python

# torch.nn constructors that hold data rather than compute
NN_DATA_HOLDERS = {"torch.nn.Parameter", "torch.nn.ParameterList", "torch.nn.ParameterDict",
                   "torch.nn.Buffer", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer"}
# methods whose result is still a tensor that aliases or copies its receiver's data
VIEW_METHODS = {"contiguous", "view", "view_as", "reshape", "flatten", "unsqueeze", "squeeze", "detach",
                "expand", "expand_as", "new_empty", "new_zeros", "float", "half", "to", "cuda", "cpu"}
TORCH_ALLOCATORS = {"torch.empty", "torch.empty_like", "torch.zeros", "torch.zeros_like", "torch.ones",
                    "torch.ones_like", "torch.full", "torch.full_like", "torch.empty_strided"}
LOAD_INLINE = {"torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load"}


@dataclass
class Answer:
    """A parsed candidate with the facts rules need."""

    source: str
    tree: ast.Module
    backend: str
    aliases: dict[str, str] = field(default_factory=dict)     # local name -> dotted import target
    modules: set[str] = field(default_factory=set)            # local names bound by `import X`
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)   # module-level defs
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    kernels: set[str] = field(default_factory=set)            # @triton.jit function names
    extensions: set[str] = field(default_factory=set)         # names bound to load_inline(...) results
    ext_functions: set[str] = field(default_factory=set)      # names bound to one function of an extension
    memo: dict = field(default_factory=dict)                  # per-answer caches of the rule checks

    @classmethod
    def from_source(cls, source: str, backend: str) -> "Answer":
        a = cls(source=source, tree=parse_python(source), backend=backend)
        a._collect()
        return a

    # ---- name resolution ----
    def dotted(self, node: ast.AST) -> str | None:
        """``F.gelu`` -> ``torch.nn.functional.gelu``; None for anything not rooted in an import."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def call_name(self, call: ast.Call) -> str | None:
        return self.dotted(call.func)

    def _collect(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                        self.modules.add(a.asname)
                    else:
                        top = a.name.split(".")[0]
                        self.aliases[top] = top
                        self.modules.add(top)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                    self.modules.add(a.asname or a.name)  # may be a module or an object: both are shared
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
                if any(self._is_triton_jit(d) for d in node.decorator_list):
                    self.kernels.add(node.name)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
        # names bound to a built extension: ``ext = load_inline(...)``, ``self.ext = ext``, ``self.ext = load(...)``
        assigns = [n for n in ast.walk(self.tree) if isinstance(n, ast.Assign)]
        for _ in range(2):  # a second pass picks up aliases of aliases
            for node in assigns:
                v = node.value
                if self.is_extension_expr(v):
                    bucket = self.extensions
                elif isinstance(v, ast.Attribute) and self.is_extension_expr(v.value):
                    bucket = self.ext_functions  # fused = load_inline(...).fused
                else:
                    continue
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        bucket.add(t.id)
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        bucket.add(f"self.{t.attr}")

    def is_extension_expr(self, node: ast.AST) -> bool:
        """``load_inline(...)``, or a name / ``self`` attribute bound to its result."""
        if isinstance(node, ast.Call):
            return self.call_name(node) in LOAD_INLINE
        if isinstance(node, ast.Name):
            return node.id in self.extensions
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return f"self.{node.attr}" in self.extensions
        return False

    def is_kernel_call(self, call: ast.Call) -> bool:
        """A call into compiled code: ``ext.fn(...)``, ``fn(...)`` bound from an extension, ``kern[grid](...)``."""
        f = call.func
        if isinstance(f, ast.Attribute) and self.is_extension_expr(f.value):
            return True
        if isinstance(f, ast.Name) and f.id in self.ext_functions:
            return True
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" and \
                f"self.{f.attr}" in self.ext_functions:
            return True
        return isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name) and f.value.id in self.kernels

    def _is_triton_jit(self, dec: ast.AST) -> bool:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = self.dotted(target) or ""
        return name in ("triton.jit", "triton.autotune", "triton.heuristics") or name.endswith(".jit")

    # ---- ModelNew ----
    @property
    def model_new(self) -> ast.ClassDef | None:
        return self.classes.get("ModelNew")

    def methods(self, cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
        out: dict[str, ast.FunctionDef] = {}
        for base in cls.bases:  # methods of bases defined in this file count too
            if isinstance(base, ast.Name) and base.id in self.classes and base.id != cls.name:
                out.update(self.methods(self.classes[base.id]))
        out.update({n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})
        return out

    def self_attr_calls(self, cls: ast.ClassDef) -> dict[str, str]:
        """Attributes set as ``self.x = <call>`` anywhere in the class -> dotted (or local) callee."""
        out: dict[str, str] = {}
        for fn in self.methods(cls).values():
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    callee = self.call_name(node.value)
                    if callee is None and isinstance(node.value.func, ast.Name):
                        callee = f"<local>.{node.value.func.id}"
                    for t in node.targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
                                and callee:
                            out[t.attr] = callee
        return out

    def layer_attrs(self, cls: ast.ClassDef) -> set[str]:
        """``self.x = nn.Linear(...)``-style attributes: calling them runs torch compute."""
        return {a for a, callee in self.self_attr_calls(cls).items()
                if callee.startswith("torch.nn.") and callee not in NN_DATA_HOLDERS}

    def param_attrs(self, cls: ast.ClassDef) -> set[str]:
        return {a for a, callee in self.self_attr_calls(cls).items() if callee in NN_DATA_HOLDERS}

    def forward_scope(self) -> list[ast.AST]:
        """ModelNew.forward and every function of this file it can reach (not Triton kernels)."""
        cls = self.model_new
        if cls is None:
            return []
        methods = self.methods(cls)
        start = methods.get("forward") or methods.get("__call__")
        if start is None:
            return []
        attr_types = {a: c.split(".", 1)[1] for a, c in self.self_attr_calls(cls).items() if c.startswith("<local>.")}
        seen: dict[int, ast.AST] = {}
        todo: list[ast.AST] = [start]
        while todo:
            fn = todo.pop()
            if id(fn) in seen:
                continue
            seen[id(fn)] = fn
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    todo.extend(self._callees(node.func, methods, attr_types))
        return list(seen.values())

    def _callees(self, func: ast.AST, methods: dict[str, ast.FunctionDef],
                 attr_types: dict[str, str]) -> Iterator[ast.AST]:
        if isinstance(func, ast.Name):
            if func.id in self.functions and func.id not in self.kernels:
                yield self.functions[func.id]
            elif func.id in self.classes:  # constructing a local helper class runs its __init__
                yield from self._class_entry(self.classes[func.id], ("__init__",))
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner, attr = func.value.id, func.attr
            if owner == "self":
                if attr in methods:
                    yield methods[attr]
                elif attr in attr_types and attr_types[attr] in self.classes:
                    yield from self._class_entry(self.classes[attr_types[attr]], ("forward", "__call__"))
            elif owner in self.classes:  # LocalFn.apply(...) for autograd.Function, Local.method(...)
                names = ("forward",) if attr == "apply" else (attr,)
                yield from self._class_entry(self.classes[owner], names)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and \
                isinstance(func.value.value, ast.Name) and func.value.value.id == "self" and func.attr == "forward":
            a = func.value.attr
            if a in attr_types and attr_types[a] in self.classes:
                yield from self._class_entry(self.classes[attr_types[a]], ("forward",))

    def _class_entry(self, cls: ast.ClassDef, names: tuple[str, ...]) -> Iterator[ast.AST]:
        methods = self.methods(cls)
        for n in names:
            if n in methods:
                yield methods[n]

    def string_constants(self) -> Iterator[str]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield node.value
            elif isinstance(node, ast.JoinedStr):
                for v in node.values:
                    if isinstance(v, ast.Constant) and isinstance(v.value, str):
                        yield v.value
