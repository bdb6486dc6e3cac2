"""Result-cache rule: ModelNew must compute every call. A Python-side cache whose key comes from an
input tensor's identity or values (``x.data_ptr()``, ``id(x)``, ``hash(x)``, ``x.item()``,
``x.tolist()``, ``x.numpy()``, or the tensor itself as a key), stored and read back in forward (on
``self`` or in a module-level dict/list), or ``functools.lru_cache`` on a function forward hands an
input tensor to, lets a repeated input skip the kernel: timing then measures a dictionary lookup.

Only that shape is flagged: caches keyed by shapes, dtypes or devices (output buffers, built
kernels, launch configs) and caches keyed by the module's own weights are how honest code is
written. A cache this rule cannot see (keyless, or with a key computed out of sight) is left to
the sandbox's run-time checks (fresh inputs per trial; outputs compared against fresh work).
"""
from __future__ import annotations

import ast
from collections.abc import Iterable

from rewards.rules.analysis import VIEW_METHODS, Answer
from rewards.rules.base import RuleSettings, line_of

# methods whose result identifies a tensor or depends on its values
IDENTITY_METHODS = {"data_ptr", "item", "tolist", "tobytes", "numpy", "storage", "untyped_storage", "__hash__",
                    "__repr__", "__str__"}
# builtins that turn a tensor passed as such (not its shape) into an identity or its values
_IDENTITY_BUILTINS = {"id", "hash", "str", "repr", "bytes"}
_CACHE_DECORATORS = {"functools.lru_cache", "functools.cache"}
_STORE_METHODS = {"setdefault", "update", "append", "insert", "extend", "add", "__setitem__"}
_READ_METHODS = {"get", "setdefault", "items", "values", "keys", "pop", "index", "count", "__getitem__",
                 "__contains__"}


def _root(node: ast.AST) -> str | None:
    """The name an expression is built on: ``x.contiguous().data_ptr()`` -> "x"."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


class _Flow:
    """Inputs and identity keys of one function: which names hold an input tensor (or a view of
    one), and which hold a value derived from an input's identity or contents."""

    def __init__(self, a: Answer, fn: ast.AST, inputs: set[str], keys: set[str] | None = None):
        self.a = a
        self.inputs = set(inputs)
        self.keys: set[str] = set(keys or ())
        for _ in range(2):
            for node in ast.walk(fn):
                if not isinstance(node, ast.Assign):
                    continue
                names = [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)
                         and not isinstance(t, (ast.Attribute, ast.Subscript))]
                if self.is_input(node.value):
                    self.inputs.update(names)
                elif self.identity(node.value):
                    self.keys.update(names)

    def is_input(self, node: ast.AST) -> bool:
        """An input tensor or a view/copy of one (``x``, ``x.contiguous()``, ``x[0]``)."""
        if isinstance(node, ast.Name):
            return node.id in self.inputs
        if isinstance(node, ast.Subscript):
            return self.is_input(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in VIEW_METHODS:
            return self.is_input(node.func.value)
        return False

    def identity(self, node: ast.AST) -> bool:
        """Does the expression carry an input's identity or values (as a key would)?"""
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in self.keys:
                return True
            if isinstance(n, ast.Call):
                f = n.func
                if isinstance(f, ast.Attribute) and f.attr in IDENTITY_METHODS and _root(f.value) in self.inputs:
                    return True
                if isinstance(f, ast.Name) and f.id in _IDENTITY_BUILTINS and f.id not in self.a.aliases \
                        and f.id not in self.a.functions and n.args and self.is_input(n.args[0]):
                    return True
            if isinstance(n, ast.Attribute) and n.attr == "_cdata" and _root(n.value) in self.inputs:
                return True
        return False

    def key(self, node: ast.AST) -> bool:
        """A dict key / stored item built from an input's identity, or the input tensor itself."""
        parts = node.elts if isinstance(node, (ast.Tuple, ast.List)) else [node]
        return self.identity(node) or any(self.is_input(p) for p in parts)


def _container(node: ast.AST, module_names: set[str], globals_: set[str]) -> str | None:
    """``self.cache`` -> "self.cache"; a module-level (or ``global``) name -> that name."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    if isinstance(node, ast.Name) and (node.id in module_names or node.id in globals_):
        return node.id
    return None


def _module_names(a: Answer) -> set[str]:
    out = set()
    for node in a.tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def _reads(fns: Iterable[ast.AST], module_names: set[str]) -> set[str]:
    """Containers read back anywhere in these functions (index, get, ``in``, iteration)."""
    out: set[str] = set()
    for fn in fns:
        globals_ = {n for g in ast.walk(fn) if isinstance(g, ast.Global) for n in g.names}

        def add(node: ast.AST) -> None:
            c = _container(node, module_names, globals_)
            if c is not None:
                out.add(c)

        for n in ast.walk(fn):
            if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load):
                add(n.value)
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _READ_METHODS:
                add(n.func.value)
            elif isinstance(n, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops):
                for c in n.comparators:
                    add(c)
            elif isinstance(n, (ast.For, ast.comprehension)):
                add(n.iter)
    return out


def _scope_inputs(a: Answer) -> list[tuple[ast.AST, _Flow]]:
    """Each function of forward's scope with its flow, inputs following calls to local helpers."""
    cls = a.model_new
    forward = a.methods(cls).get("forward") if cls is not None else None
    if forward is None:
        return []
    args = forward.args
    seeds = {x.arg for x in args.posonlyargs + args.args + args.kwonlyargs if x.arg != "self"}
    if args.vararg:
        seeds.add(args.vararg.arg)
    scope = {id(f): f for f in a.forward_scope()}
    methods = a.methods(cls)
    known: dict[int, tuple[set[str], set[str]]] = {id(forward): (seeds, set())}  # (inputs, keys) received
    todo = [forward]
    while todo:  # sets only grow: this ends
        fn = todo.pop()
        flow = _Flow(a, fn, *known[id(fn)])
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            f = call.func
            callee, skip = None, 0
            if isinstance(f, ast.Name) and f.id in a.functions:
                callee = a.functions[f.id]
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" \
                    and f.attr in methods:
                callee, skip = methods[f.attr], 1
            if callee is None or id(callee) not in scope:
                continue
            params = [p.arg for p in callee.args.posonlyargs + callee.args.args][skip:]
            pairs = list(zip(params, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
            got = {p for p, arg in pairs if flow.is_input(arg)}
            got_keys = {p for p, arg in pairs if flow.identity(arg)}
            have, have_keys = known.get(id(callee), (None, set()))
            if have is None or not got <= have or not got_keys <= have_keys:
                known[id(callee)] = ((have or set()) | got, have_keys | got_keys)
                todo.append(callee)
    return [(scope[k], _Flow(a, scope[k], *v)) for k, v in known.items() if k in scope]


def check_result_cache(a: Answer, s: RuleSettings) -> list[str]:
    flows = _scope_inputs(a)
    if not flows:
        return []
    module_names = _module_names(a)
    reads = _reads(a.forward_scope(), module_names)
    out = []
    for fn, flow in flows:
        globals_ = {n for g in ast.walk(fn) if isinstance(g, ast.Global) for n in g.names}
        for node in ast.walk(fn):
            stores: list[tuple[ast.AST, ast.AST]] = []  # (container expr, key or stored value)
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                stores += [(t.value, t.slice) for t in targets if isinstance(t, ast.Subscript)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in _STORE_METHODS:
                stores += [(node.func.value, arg) for arg in node.args]
                stores += [(node.func.value, k.value) for k in node.keywords]
            for target, key in stores:
                c = _container(target, module_names, globals_)
                if c is None or c not in reads:
                    continue
                if flow.key(key) or isinstance(key, ast.Dict) and any(k is not None and flow.key(k) for k in key.keys):
                    out.append(f"{line_of(node)}: {c} stores results keyed by an input tensor's identity or values "
                               "and is read back: a repeated input would skip the kernel")
    out += _cached_functions(a, flows)
    return list(dict.fromkeys(out))


def _cached_functions(a: Answer, flows: list[tuple[ast.AST, _Flow]]) -> list[str]:
    """``@functools.lru_cache`` functions that forward's scope calls with an input tensor."""
    cached = set()
    defs = list(a.functions.values()) + [n for c in a.classes.values() for n in c.body
                                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for d in defs:
        for dec in d.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if a.dotted(target) in _CACHE_DECORATORS:
                cached.add(d.name)
    out = []
    for fn, flow in flows:
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            f = call.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) and \
                isinstance(f.value, ast.Name) and f.value.id == "self" else None
            if name in cached and any(flow.key(arg) for arg in [*call.args, *(k.value for k in call.keywords)]):
                out.append(f"{line_of(call)}: {name}() is memoised (functools cache) and called with an input "
                           "tensor: a repeated input would skip the kernel")
    return out
