"""Rules against escaping the harness: fallbacks, the reference, processes, streams, patching,
files, network, the environment and dynamic code."""
from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from rewards.rules.analysis import Answer
from rewards.rules.base import RuleSettings, calls_in, line_of


def check_try_except(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for node in ast.walk(a.tree):
        if isinstance(node, ast.Try) and node.handlers or type(node).__name__ == "TryStar":
            out.append(f"{line_of(node)}: try/except can hide a failing kernel behind a fallback")
    return out


def check_inherits_reference(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    cls = a.model_new
    if cls is not None:
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            if name == "Model":
                out.append(f"{line_of(base)}: ModelNew subclasses the reference Model")
            elif isinstance(base, ast.Name) and base.id in a.classes and base.id != "ModelNew":
                inner = a.classes[base.id]
                if any(getattr(b, "id", getattr(b, "attr", "")) == "Model" for b in inner.bases):
                    out.append(f"{line_of(base)}: ModelNew subclasses the reference Model through {base.id}")
    for node in a.tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in node.targets):
            if isinstance(node.value, ast.Name) and node.value.id == "Model":
                out.append(f"{line_of(node)}: ModelNew is the reference Model")
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


def check_processes(a: Answer, s: RuleSettings) -> list[str]:
    out = [f"{line_of(n)}: imports {m}" for n, m in _module_hits(a, _PROCESS_MODULES)]
    for call in calls_in([a.tree]):
        name = a.call_name(call) or ""
        if _PROCESS_CALLS.match(name):
            out.append(f"{line_of(call)}: {name}() starts or signals processes")
    return out


_STREAM_CALLS = {"torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.ExternalStream",
                 "torch.Stream", "torch.cuda.streams.Stream"}
_STREAM_TEXT = re.compile(r"\b(cudaStreamCreate\w*|getStreamFromPool|cudaStreamPerThread|cudaStreamNonBlocking|"
                          r"cudaLaunchHostFunc|cudaGraphLaunch)\b")


def check_streams(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for call in calls_in([a.tree]):
        name = a.call_name(call)
        if name in _STREAM_CALLS:
            out.append(f"{line_of(call)}: {name}(...) runs work outside the timed stream")
    for text in a.string_constants():
        for m in _STREAM_TEXT.finditer(text):
            out.append(f"kernel source uses {m.group(1)}: work outside the timed stream")
    return out


def check_monkey_patching(a: Answer, s: RuleSettings) -> list[str]:
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
                    out.append(f"{line_of(node)}: rebinds {name} (patching a module or library object)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args and isinstance(node.args[0], (ast.Name, ast.Attribute)):
            root = _root_of(node.args[0])
            if root in a.modules or root in ("__builtins__", "builtins"):
                out.append(f"{line_of(node)}: {node.func.id}() on {ast.unparse(node.args[0])} patches a library")
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


def check_file_or_network(a: Answer, s: RuleSettings) -> list[str]:
    out = [f"{line_of(n)}: imports {m}" for n, m in _module_hits(a, _NET_MODULES)]
    for call in calls_in([a.tree]):
        f = call.func
        name = a.call_name(call) or ""
        if isinstance(f, ast.Name) and f.id == "open" and "open" not in a.aliases:
            out.append(f"{line_of(call)}: open() reads or writes files")
        elif _FILE_CALLS.match(name):
            out.append(f"{line_of(call)}: {name}() touches the file system")
        elif isinstance(f, ast.Attribute) and f.attr in _PATH_METHODS and _is_pathlike(a, f.value):
            out.append(f"{line_of(call)}: .{f.attr}() on a path touches the file system")
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


def check_environment(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for node in ast.walk(a.tree):
        if isinstance(node, (ast.Attribute, ast.Name)):
            name = a.dotted(node)
            if name in ("os.environ", "os.environb", "os.getenv", "os.putenv", "os.unsetenv", "posix.environ"):
                # report the outermost use only once per line
                out.append(f"{line_of(node)}: {name} reads or changes the environment (secrets live there)")
    return sorted(set(out))


_REFERENCE_MODULES = {"__main__", "importlib", "runpy", "gc", "inspect", "sys", "builtins", "ctypes"}
_REFERENCE_NAME = re.compile(r"(^|\.)(ref|reference|task|problem)(_\w+)?$")


def check_reference_access(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for node, mod in _imported_modules(a):
        top = mod.split(".")[0]
        if top in _REFERENCE_MODULES and not mod.startswith("sys.") or _REFERENCE_NAME.search(mod):
            out.append(f"{line_of(node)}: imports {mod}, which can reach the reference or the harness")
        elif mod in ("sys.modules", "sys._getframe"):
            out.append(f"{line_of(node)}: imports {mod}")
    for node in ast.walk(a.tree):
        if isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
            out.append(f"{line_of(node)}: uses the reference class Model")
        elif isinstance(node, ast.Name) and node.id in ("get_inputs", "get_init_inputs", "globals", "vars") \
                and isinstance(node.ctx, ast.Load):
            out.append(f"{line_of(node)}: uses {node.id}, which belongs to the harness")
        elif isinstance(node, ast.Attribute) and node.attr in ("modules", "_getframe", "f_back", "f_globals",
                                                               "f_locals", "__subclasses__", "__globals__"):
            out.append(f"{line_of(node)}: .{node.attr} reaches outside the answer")
    return sorted(set(out))


_DYNAMIC_CALLS = {"eval", "exec", "compile", "__import__", "breakpoint"}


def check_dynamic_code(a: Answer, s: RuleSettings) -> list[str]:
    out = []
    for node in ast.walk(a.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            fn = node.func.id
            if fn in _DYNAMIC_CALLS and fn not in a.aliases and fn not in a.functions:
                out.append(f"{line_of(node)}: {fn}() runs code these checks cannot see")
            elif fn in ("getattr", "hasattr") and node.args and a.dotted(node.args[0]) is not None:
                out.append(f"{line_of(node)}: {fn}() on {ast.unparse(node.args[0])} looks names up dynamically")
        elif isinstance(node, ast.ImportFrom) and any(al.name == "*" for al in node.names):
            out.append(f"{line_of(node)}: 'from {node.module} import *' hides which names are used")
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            out.append(f"{line_of(node)}: __builtins__ reaches the interpreter")
    return out
