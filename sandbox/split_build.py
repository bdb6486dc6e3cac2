"""The split C++ build: an answer's own code compiled alone, bound by trusted objects built once.

torch's ``load_inline`` compiles one ``main.cpp`` (torch/extension.h, the answer's ``cpp_sources``,
a ``PYBIND11_MODULE`` block); even with a PCH of the header, most of that compile is the header's
Python half (pybind11 and torch-python code instantiated and generated again in every answer;
docs/sandbox.md, "Where a cold C++ build's time goes"). Here the answer's ``cpp_sources`` are
compiled on a PCH of the ``min`` header tier (sandbox/build.py ``MIN_TYPES_H``: the tensor class
and common ops, no Python) and the tensor operators (:data:`SPLIT_EXTENSION_H`), with a tail this
module writes: a ``PyInit_<name>`` that hands each exported function to a trusted binder chosen at
compile time by the function's C++ type. The
binders (torch's own ``m.def(name, torch::wrap_pybind_function(fn), doc)``, one per signature of
:data:`SIGNATURES`) and the module runtime live in one trusted shared library built once per torch
install, so the module behaves as torch's does (names, docstrings, Tensor in and out, C++ errors as
Python exceptions).

Only the trusted pool builds the library and the PCHs (``python -m sandbox.split_build``), into a
directory no sandbox can write (the same rule as the PCH: docs/sandbox.md). The answer's object is
linked against that library, never with its objects: the library exports only ``sbx_*`` entry
points, is built with hidden visibility and ``-Bsymbolic`` (its internal calls cannot be
interposed by symbols of the answer's module), and an answer object that defines any ``sbx_``
symbol is refused (:class:`ReservedSymbol`: the build fails, it does not fall back). An answer that
does not compile this way (a signature without a binder, an overloaded or non-function export, code
that needs more than the ``min`` tier) is built as torch would, through the PCH path
(:func:`sandbox.build.install_build_hooks` records the choice so the run step repeats it).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import product
from pathlib import Path
from typing import Any

from sandbox import build

LIBRARY = "libsbx_split.so"
# Exported functions' C++ types that have a trusted binder: Tensor results, 1-3 tensors (by value or
# const reference) and then up to two scalars. Covers every C++ answer of rewards/corpus/cpu
# (Tensor(Tensor), (Tensor, double), (Tensor, Tensor, double), (Tensor, double, double),
# (Tensor, Tensor, Tensor)); anything else builds the old way.
_TENSORS = ("at::Tensor", "const at::Tensor&")
_SCALAR_TAILS = ((), ("double",), ("double", "double"), ("float",), ("float", "float"), ("int64_t",),
                 ("int64_t", "int64_t"), ("int",), ("bool",), ("double", "int64_t"))
SIGNATURES: tuple[tuple[str, ...], ...] = tuple(
    ("at::Tensor", *([t] * n), *tail) for t, n, tail in product(_TENSORS, (1, 2, 3), _SCALAR_TAILS))

# What an answer's torch/extension.h is in a split build: the min tier (torch/types.h there is
# MIN_TYPES_H) and the tensor operators (x * s, a + b), which answers use and the min tier lacks.
SPLIT_EXTENSION_H = build.NARROW_EXTENSION_H + "#include <ATen/TensorOperators.h>\n"
RUNTIME_CPP = """\
// sandbox/split_build.py: trusted, built once per torch install by the pool, never in a sandbox.
#include <torch/extension.h>
#define SBX_EXPORT extern "C" __attribute__((visibility("default")))
typedef void (*sbx_binder)(void*, const char*, const char*, void*);
// The module object of a split build: what PYBIND11_MODULE does, with the answer's functions bound
// by the binders its PyInit chose. Errors become the ImportError of the answer's import.
SBX_EXPORT PyObject* sbx_make_module(const char* name, int n, const char* const* names,
                                     const char* const* docs, void* const* fns, const sbx_binder* binders) {
  try {
    auto* def = new PyModuleDef();  // one per module, alive as long as the module (forever)
    auto m = pybind11::module_::create_extension_module(name, nullptr, def);
    for (int i = 0; i < n; ++i) binders[i](&m, names[i], docs[i], fns[i]);
    return m.release().ptr();
  } catch (pybind11::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ImportError, e.what());
    return nullptr;
  }
}
"""


# The library: hidden visibility, its own references bound to itself (-Bsymbolic), and only the sbx_
# entry points exported, so no symbol of an answer's module can take the place of its code.
_LIBRARY_FLAGS = ("-shared", "-O2", "-fvisibility=hidden", "-Wl,-Bsymbolic")
_EXPORTS = "{ global: sbx_*; local: *; };\n"


def signature_id(sig: tuple[str, ...]) -> str:
    """A C identifier for one signature ('T_T' style names would be ambiguous for references)."""
    short = {"at::Tensor": "T", "const at::Tensor&": "R", "double": "d", "float": "f", "int64_t": "l",
             "int": "i", "bool": "b"}
    return short[sig[0]] + "_" + "".join(short[a] for a in sig[1:])


def _fn_type(sig: tuple[str, ...]) -> str:
    return f"{sig[0]} (*)({', '.join(sig[1:])})"


def binders_cpp() -> str:
    """The trusted binders, one per :data:`SIGNATURES` entry: torch's own ``m.def`` line."""
    out = []
    for sig in SIGNATURES:
        out.append(f'SBX_EXPORT void sbx_bind_{signature_id(sig)}(void* m, const char* name, const char* doc, void* fn) {{\n'
                   f'  using Fn = {sig[0]} (*)({", ".join(sig[1:])});\n'
                   f'  static_cast<pybind11::module_*>(m)->def(name, torch::wrap_pybind_function(reinterpret_cast<Fn>(fn)), doc);\n}}')
    return "\n".join(out) + "\n"


def answer_tail(module_name: str, functions: dict[str, str]) -> str:
    """Appended to the answer's unit: the binder each function's type selects (no binder: no
    specialisation, a compile error, the old build) and the module's ``PyInit``."""
    lines = ["namespace sbx_split {",
             "typedef void (*binder_t)(void*, const char*, const char*, void*);",
             "template <class F> struct binder;  // a type without a trusted binder does not compile"]
    for sig in SIGNATURES:
        sid = signature_id(sig)
        lines.append(f'extern "C" void sbx_bind_{sid}(void*, const char*, const char*, void*);')
        lines.append(f"template <> struct binder<{_fn_type(sig)}> {{ static constexpr binder_t fn = &sbx_bind_{sid}; }};")
    lines += ["}  // namespace sbx_split",
              'extern "C" void* sbx_make_module(const char*, int, const char* const*, const char* const*, '
              "void* const*, const sbx_split::binder_t*);",
              f'extern "C" __attribute__((visibility("default"))) void* PyInit_{module_name}(void) {{']
    names = ", ".join(json.dumps(n) for n in functions)
    docs = ", ".join(json.dumps(d) for d in functions.values())
    lines += [f"  static const char* const names[] = {{{names}}};",
              f"  static const char* const docs[] = {{{docs}}};",
              # ::name: the answer's function at namespace scope, never one of these locals
              "  void* const fns[] = {" + ", ".join(f"reinterpret_cast<void*>(&::{n})" for n in functions) + "};",
              "  static const sbx_split::binder_t b[] = {"
              + ", ".join(f"sbx_split::binder<decltype(&::{n})>::fn" for n in functions) + "};",
              f'  return sbx_make_module("{module_name}", {len(functions)}, names, docs, fns, b);', "}", ""]
    return "\n".join(lines)


def runtime_key() -> str:
    import torch

    text = json.dumps([torch.__version__, sys.version, build._compiler(), RUNTIME_CPP, binders_cpp(), _LIBRARY_FLAGS,
                       _EXPORTS])
    return "runtime-" + hashlib.sha256(text.encode()).hexdigest()[:20]


def min_pch_dir(root: str | Path, extra_cflags: list[str]) -> Path:
    headers = hashlib.sha256((SPLIT_EXTENSION_H + build.MIN_TYPES_H).encode()).hexdigest()[:8]
    return Path(root) / f"min-{build.pch_key(extra_cflags)}-{headers}"


def ready(root: str | Path, extra_cflags: list[str]) -> bool:
    """Whether the trusted parts for a flag set are built (library, ``min`` PCH, narrow headers)."""
    pch = min_pch_dir(root, extra_cflags)
    return ((Path(root) / runtime_key() / LIBRARY).is_file() and (pch / "torch" / "extension.h.gch").is_file()
            and (Path(root) / "narrow" / "min" / "torch" / "types.h").is_file())


def _atomic_dir(final: Path, make: Any) -> Path:
    """Build into a temp dir beside ``final`` with ``make(tmp)``, then rename (a racing builder's win is kept)."""
    if final.exists():
        return final
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".building-"))
    try:
        make(tmp)
        try:
            tmp.rename(final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _torch_libs() -> list[str]:
    from torch.utils import cpp_extension

    return [f"-L{cpp_extension.library_paths()[0]}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]


def build_trusted(root: str | Path, extra_cflags: list[str], timeout_s: float = 1800) -> dict[str, float]:
    """Trusted (the pool, unsandboxed): the runtime library once, the ``min`` PCH per flag set.
    Raises ValueError for a flag set outside :data:`sandbox.build.PCH_FLAG_SETS` (the request may be forged)."""
    if not build.pch_allowed(extra_cflags):
        raise ValueError(f"no split build for extra_cflags {extra_cflags!r}: not one of sandbox.build.PCH_FLAG_SETS")
    flags = build.pch_flags(extra_cflags) or []
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    narrow = build.write_narrow_header(root / "narrow")
    seconds: dict[str, float] = {}

    def library(tmp: Path) -> None:
        src = tmp / "runtime.cpp"
        src.write_text(RUNTIME_CPP + binders_cpp())
        exports = tmp / "exports.map"  # the sbx_ entry points only: no other symbol to clash with or interpose
        exports.write_text(_EXPORTS)
        cmd = [build._compiler(), str(src), "-o", str(tmp / LIBRARY), *_LIBRARY_FLAGS, f"-Wl,--version-script={exports}",
               *build.pch_cflags([]), *_torch_libs()]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout_s)
        seconds["runtime_s"] = round(time.perf_counter() - t, 1)

    def min_pch(tmp: Path) -> None:
        (tmp / "torch").mkdir()
        header = tmp / "torch" / "extension.h"  # beside the .gch: a second #include finds it (pragma once)
        header.write_text(SPLIT_EXTENSION_H)
        cmd = [build._compiler(), "-x", "c++-header", str(header), "-o", str(tmp / "torch" / "extension.h.gch"),
               f"-I{narrow / 'min'}", *build.pch_cflags(flags)]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout_s)
        seconds["min_pch_s"] = round(time.perf_counter() - t, 1)

    _atomic_dir(root / runtime_key(), library)
    _atomic_dir(min_pch_dir(root, flags), min_pch)
    return seconds


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # ASCII: a C name, and a PyInit_<name> Python finds


class ReservedSymbol(RuntimeError):
    """The answer's object defines a symbol of the trusted library's namespace: the build fails."""


def applies(call: dict[str, Any], cuda: bool = False) -> dict[str, str] | None:
    """The functions to bind (name -> docstring) when a ``load_inline`` call can take the split
    path, else None: a C++-only (``cuda``: a C++ and CUDA, sandbox/split_cuda.py) Python module with
    torch's error handling, a project flag set, and functions that are C identifiers."""
    if any(call.get(k) for k in ("sycl_sources", "with_sycl", "no_implicit_headers")):
        return None
    if bool(call.get("cuda_sources")) != cuda or (not cuda and call.get("with_cuda")):
        return None
    if call.get("is_python_module", True) is not True or call.get("with_pytorch_error_handling", True) is not True:
        return None
    if call.get("extra_include_paths") or call.get("build_directory") or not build.pch_allowed(call.get("extra_cflags") or []):
        return None
    functions = call.get("functions")
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, (list, tuple)):
        functions = {f: f for f in functions}
    if not isinstance(functions, dict) or not functions:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) and _IDENTIFIER.fullmatch(k) for k, v in functions.items()):
        return None
    name = call.get("name")
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        return None
    return dict(functions)


def module_path(build_dir: str | Path, name: str) -> Path:
    return Path(build_dir) / f"{name}_split" / f"{name}.so"


def build_module(call: dict[str, Any], functions: dict[str, str], root: str | Path, build_dir: str | Path) -> Path | None:
    """Compile and link the answer's split module; None when its unit does not compile this way
    (the caller builds it the old way). A stamp of the inputs makes a repeat (the run step) a no-op."""
    flags = build.pch_flags(call.get("extra_cflags") or []) or []
    sources = call.get("cpp_sources") or []
    sources = [sources] if isinstance(sources, str) else list(sources)
    unit = "#include <torch/extension.h>\n" + "\n".join(sources) + "\n" + answer_tail(call["name"], functions)
    out = module_path(build_dir, call["name"])
    lib_dir = Path(root) / runtime_key()
    ldflags = [str(f) for f in call.get("extra_ldflags") or []]
    compile_cmd = [build._compiler(), f"-I{min_pch_dir(root, flags)}", f"-I{Path(root) / 'narrow' / 'min'}",
                   f"-DTORCH_EXTENSION_NAME={call['name']}", *build.pch_cflags(flags), "-Winvalid-pch", "-c"]
    link_cmd = [build._compiler(), "-shared", *ldflags, *_torch_libs(), f"-L{lib_dir}", "-lsbx_split",
                f"-Wl,-rpath,{lib_dir}"]
    stamp = hashlib.sha256(json.dumps([unit, compile_cmd, link_cmd]).encode()).hexdigest()
    stamp_file = out.parent / "stamp"
    if out.is_file() and stamp_file.is_file() and stamp_file.read_text() == stamp:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    src, obj = out.parent / "answer.cpp", out.parent / "answer.o"
    src.write_text(unit)
    verbose = bool(call.get("verbose"))
    proc = subprocess.run([*compile_cmd, str(src), "-o", str(obj)], capture_output=not verbose, text=True)
    if proc.returncode != 0:
        return None
    nm = subprocess.run(["nm", "--defined-only", "-g", "-P", str(obj)], capture_output=True, text=True, check=True)
    reserved = sorted({line.split()[0] for line in nm.stdout.splitlines() if line.startswith("sbx_")})
    if reserved:
        raise ReservedSymbol(f"Error building extension '{call['name']}': the answer defines reserved symbol(s) "
                             f"{', '.join(reserved[:5])} (the sbx_ prefix is the trusted library's)")
    proc = subprocess.run([*link_cmd[:2], str(obj), *link_cmd[2:], "-o", str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"Error building extension '{call['name']}': split link failed: {proc.stderr[-2000:]}")
    stamp_file.write_text(stamp)
    return out


def load_module(name: str, path: Path) -> Any:
    """Import the built module as torch does (``importlib`` from the file, under the extension's name)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"no module spec for {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first(call: dict[str, Any], split_root: str | None, build_dir: str,
          split_wanted: list[list[str]] | None) -> tuple[str, Any] | None:
    """The split build of a first build: None when it does not apply (or its trusted parts are not
    built yet: then the flag set is reported), (root, None) when the answer's unit did not compile
    that way (the old build follows, recorded as ``fallback``), (root, module) when it built."""
    from sandbox import split_cuda

    cuda = bool(call.get("cuda_sources"))
    functions = (split_cuda.applies(call) if cuda else applies(call)) if split_root else None
    if functions is None:
        return None
    flags = build.pch_flags(call.get("extra_cflags") or []) or []
    if not ready(split_root, flags):  # type: ignore[arg-type]
        if split_wanted is not None:
            split_wanted.append(flags)
        return None
    path = (split_cuda.build_module if cuda else build_module)(call, functions, split_root, build_dir)  # type: ignore[arg-type]
    return str(split_root), (load_module(str(call["name"]), path) if path else None)


def again(call: dict[str, Any], split_root: str, build_dir: str) -> Any:
    """The run step: the module the compile step built (the stamp makes this a load, not a build)."""
    from sandbox import split_cuda

    cuda = bool(call.get("cuda_sources"))
    functions = split_cuda.applies(call) if cuda else applies(call)
    path = (split_cuda.build_module if cuda else build_module)(call, functions, split_root, build_dir) if functions else None
    if path is None:
        raise RuntimeError(f"Error building extension '{call['name']}': the split build recorded for it no longer builds")
    return load_module(str(call["name"]), path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the split C++ build's trusted parts for one flag set.")
    ap.add_argument("--root", required=True)
    ap.add_argument("--cflags", default="[]", help="JSON list of extra_cflags")
    a = ap.parse_args(argv)
    cflags = json.loads(a.cflags)
    if not build.pch_allowed(cflags):  # before anything is created: the request may be forged
        raise ValueError(f"no split build for extra_cflags {cflags!r}: not one of sandbox.build.PCH_FLAG_SETS")
    t0 = time.perf_counter()
    seconds = build_trusted(a.root, cflags)
    print(json.dumps({"root": a.root, **seconds, "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
