"""Compile cache keys and the precompiled header of torch/extension.h.

Most of a cold ``load_inline`` is g++ parsing torch/extension.h. A precompiled header (PCH) of it,
built once per set of ``extra_cflags`` by the trusted pool (never inside a sandbox, so no candidate
can plant one), cuts that. Inside the sandbox, :func:`install_build_hooks` wraps ``load_inline``:
when a PCH for the call's flags exists, its directory goes first on g++'s include path (as an
``-I`` in ``extra_cflags``, which nvcc never sees; g++ then takes ``torch/extension.h.gch`` in
place of the header, and :data:`PCH_FORWARDER` serves any later include of it). The candidate's
source and flags are otherwise unchanged, so the built module is the same.

nvcc has no PCH, and a ``.cu`` that includes torch/extension.h pays for its whole parse three times
(cudafe++, cicc, host g++). torch already puts ``#include <torch/types.h>`` at the top of every
``load_inline`` ``.cu``, which is what CUDA code uses (``torch::Tensor``, factories, ``TORCH_CHECK``,
dispatch macros). So nvcc first sees a trusted :data:`NARROW_EXTENSION_H` in place of
torch/extension.h (a directory the pool writes and no sandbox can); if that build fails, the call
is built again with the real header, under its own name so torch's versioning and the run step's
rebuild check see one consistent build. What a candidate may write is unchanged: any source that
builds with the real header builds, the narrow header only makes the common case cheaper.

Every ``load_inline`` / ``load`` call's compiler and linker arguments must pass
:func:`sandbox.flags.check_build_call` (the wrapper raises "disallowed build argument: ..." before
anything is built), and a PCH is only ever built for a flag set of :data:`PCH_FLAG_SETS`: the
flag sets reach the trusted builder through a compile step's report, which candidate code running
in the same process can forge, so :func:`build_pch` checks again (:func:`pch_allowed`).

``python -m sandbox.build --pch-root DIR --cflags '<json list>'`` builds one PCH (the pool runs it).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from sandbox.flags import DISALLOWED_MESSAGE, check_build_call

PCH_HEADER = "torch/extension.h"
# Next to the .gch: g++ takes the PCH for the first #include only, and torch's main.cpp includes
# torch/extension.h a second time whenever the answer's cpp_sources do (KernelBench answers do).
# That second #include must find a real file in the PCH dir or the build fails; this one defers to
# the real header, whose #pragma once the PCH carries, so it adds nothing.
PCH_FORWARDER = "#pragma once\n#include_next <torch/extension.h>\n"
NARROW_EXTENSION_H = """\
// sandbox/build.py: what nvcc sees for torch/extension.h. torch/types.h, which load_inline already
// includes, is all device code needs; a build this header cannot satisfy is redone with the real one.
#pragma once
#include <torch/types.h>
"""
_NARROW_OPS = ("empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
               "full_like", "arange", "matmul", "mm", "bmm", "addmm", "linear", "cat", "stack", "sum", "relu",
               "softmax", "tanh", "exp")
_DTYPES = {"kUInt8": "kByte", "kInt8": "kChar", "kInt16": "kShort", "kInt32": "kInt", "kInt64": "kLong",
           "kFloat16": "kHalf", "kFloat32": "kFloat", "kFloat64": "kDouble", "kU8": "kByte", "kI8": "kChar",
           "kI16": "kShort", "kI32": "kInt", "kI64": "kLong", "kF16": "kHalf", "kF32": "kFloat", "kF64": "kDouble"}
# What nvcc tries first for torch/types.h: the tensor class, the dispatch and check macros, and the
# factories and ops device code calls, not all of ATen and the autograd factories (~2.4x less to
# parse, measured on the CPU box). The torch:: names CUDA answers use resolve to the at:: ones.
MIN_TYPES_H = "\n".join(
    ["// sandbox/build.py: what nvcc tries first for torch/types.h; a build this header cannot satisfy is",
     "// redone with torch/types.h, then with the real torch/extension.h.",
     "#pragma once", "#include <ATen/core/Tensor.h>", "#include <ATen/Dispatch.h>", "#include <optional>"]
    + [f"#include <ATen/ops/{op}.h>" for op in _NARROW_OPS]
    + ["namespace torch {", "using namespace at;  // NOLINT", "using std::nullopt;", "using std::optional;",
       "using Dtype = at::ScalarType;"]
    + [f"constexpr auto {name} = at::{at_name};" for name, at_name in _DTYPES.items()]
    + ["}  // namespace torch", ""])
# The narrow tiers, tried in this order (each a directory put first on nvcc's include path), then
# the real header: "min" serves torch/types.h and torch/extension.h, "types" torch/extension.h only.
NARROW_TIERS = {"min": {"torch/extension.h": NARROW_EXTENSION_H, "torch/types.h": MIN_TYPES_H},
                "types": {"torch/extension.h": NARROW_EXTENSION_H}}
# Text in a .cu that needs more than torch/types.h: skip the narrow attempt rather than fail it.
_NEEDS_FULL_HEADER = ("PYBIND11", "pybind11", "py::", "torch::nn", "torch::optim", "torch::jit", "torch::autograd")
FULL_HEADER_SUFFIX = "_fullhdr"


# Part of every build key: bumped whenever how a build is made changes, so a persistent cache never
# serves a verdict of the old recipe (4: the split C++ build; 3: the "min" tier before torch/types.h;
# 2: PCH forwarder and narrow CUDA header; 1 cached compile_errors of answers that build).
BUILD_RECIPE = "4"


# The only extra_cflags a PCH is built for, exactly as written in the answer (empty strings, as in
# KernelBench's extra_cflags=[""], are dropped first: they add nothing to the command line). The
# common ones of KernelBench-style answers and of rewards/solutions; anything else builds without
# a PCH (slower, same result). Keep it a short, reviewed list: each entry runs g++ outside the sandbox.
PCH_FLAG_SETS: tuple[tuple[str, ...], ...] = (
    (),                                                  # no extra flags (also [""])
    ("-O3",),
    ("-O2",),
    ("-O3", "-fopenmp"),                                 # the CPU solutions
    ("-O3", "-ffast-math"),
    ("-O3", "-march=native"),
    ("-O3", "-ffast-math", "-fopenmp"),
    ("-O3", "-march=native", "-fopenmp"),
    ("-O3", "-ffast-math", "-march=native", "-fopenmp"),  # rewards/solutions/cpu/level2/9_*
)


def pch_flags(extra_cflags: Any) -> list[str] | None:
    """The flag set a PCH would be built for (empty strings dropped), or None when it is not a
    list of plain strings."""
    if type(extra_cflags) not in (list, tuple) or any(type(f) is not str for f in extra_cflags):
        return None
    return [f for f in extra_cflags if f]


def pch_allowed(extra_cflags: Any) -> bool:
    """Whether a PCH may be built for ``extra_cflags``: one of :data:`PCH_FLAG_SETS`, exactly."""
    flags = pch_flags(extra_cflags)
    return flags is not None and tuple(flags) in PCH_FLAG_SETS


def step_path(parent_path: str | None = None) -> str:
    """The PATH every step of the pool gets: in a venv, its ``bin`` first when a ``ninja`` is there
    (the project's pinned ``ninja`` package), then the parent's; outside a venv (a system Python,
    where that directory is /usr/bin and would reorder every tool) the parent's as it is. A
    persistent build cache is only as good as the ninja that reads it: ninja 1.13's log (version 7)
    keeps another hash of each command, so a build made by the venv's 1.13 looked dirty to the
    system's 1.11, and every run step rebuilt it inside its throw-away overlay (~44 s a cache hit
    on 2 cores, 2026-12-05: a run started with the venv activated, the next without)."""
    parent = os.environ.get("PATH", "") if parent_path is None else parent_path
    here = os.path.dirname(sys.executable)
    if sys.prefix == sys.base_prefix or not os.path.isfile(os.path.join(here, "ninja")):
        return parent
    return os.pathsep.join([here] + [p for p in parent.split(os.pathsep) if p and p != here])


def build_tools(path: str | None = None) -> str:
    """The build tools a step finds on ``path`` (default :func:`step_path`): part of every build
    key, so a cache written with one ninja or compiler is never read as up to date by another.
    Asked once per PATH and process (a pool and the warm start's prebuild stamp ask the same)."""
    return _tools_on(step_path() if path is None else path)


@functools.lru_cache(maxsize=None)
def _tools_on(path: str) -> str:
    out = []
    for tool, args in (("ninja", ["--version"]), (_compiler(), ["-dumpfullversion"])):
        found = shutil.which(tool, path=path)
        try:
            version = subprocess.run([found, *args], capture_output=True, text=True, timeout=30).stdout.strip() \
                if found else "missing"
        except (OSError, subprocess.SubprocessError):
            version = "unknown"
        out.append(f"{tool}={found}:{version}")
    return " ".join(out)


def build_key(candidate_src: str, backend: str, arch: str, torch_version: str, tools: str = "") -> str:
    """Content address of a candidate's build (``tools``: :func:`build_tools`)."""
    h = hashlib.sha256()
    for part in (candidate_src, backend, arch, torch_version, sys.version, BUILD_RECIPE, tools):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def task_key(task_src: str, device: str) -> str:
    return hashlib.sha256(f"{task_src}\0{device}".encode()).hexdigest()[:32]


def pch_key(extra_cflags: list[str]) -> str:
    import torch

    h = hashlib.sha256(json.dumps([torch.__version__, sys.version, _compiler(), list(extra_cflags)]).encode())
    return h.hexdigest()[:24]


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def pch_cflags(extra_cflags: list[str]) -> list[str]:
    """The flags torch's JIT gives main.cpp, minus the extension name (which the header ignores)."""
    from torch.utils import cpp_extension

    includes = cpp_extension.include_paths() + [sysconfig.get_path("include")]
    flags = ["-DTORCH_API_INCLUDE_EXTENSION_H"]
    for inc in includes:
        flags += ["-isystem", inc]
    return flags + ["-fPIC", "-std=c++20"] + list(extra_cflags)


def build_pch(pch_root: str | Path, extra_cflags: list[str], timeout_s: float = 900) -> Path:
    """Build the PCH for ``extra_cflags`` under ``pch_root/<key>`` (atomic rename); returns the dir.

    Raises ValueError for a flag set that is not in :data:`PCH_FLAG_SETS` (the request may be forged).
    """
    from torch.utils import cpp_extension

    if not pch_allowed(extra_cflags):
        raise ValueError(f"no PCH for extra_cflags {extra_cflags!r}: not one of sandbox.build.PCH_FLAG_SETS")
    extra_cflags = pch_flags(extra_cflags)  # type: ignore[assignment]
    final = Path(pch_root) / pch_key(extra_cflags)
    if _pch_complete(final):
        return final
    Path(pch_root).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=pch_root, prefix=".building-"))
    out = tmp / (PCH_HEADER + ".gch")
    out.parent.mkdir(parents=True)
    header = Path(cpp_extension.include_paths()[0]) / PCH_HEADER
    cmd = [_compiler(), "-x", "c++-header", str(header), "-o", str(out)] + pch_cflags(extra_cflags)
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout_s)
        (tmp / PCH_HEADER).write_text(PCH_FORWARDER)
        (tmp / "pch.json").write_text(json.dumps({"extra_cflags": extra_cflags, "cmd": cmd, "built": time.time()}))
        if final.exists() and not _pch_complete(final):
            shutil.rmtree(final, ignore_errors=True)  # built before the forwarder existed
        try:
            tmp.rename(final)
        except OSError:  # another builder won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _pch_complete(pch_dir: Path) -> bool:
    return (pch_dir / (PCH_HEADER + ".gch")).is_file() and (pch_dir / PCH_HEADER).is_file()


def write_narrow_header(root: str | Path) -> Path:
    """The dir holding one include dir per :data:`NARROW_TIERS` entry (trusted: the pool writes it)."""
    for tier, files in NARROW_TIERS.items():
        for rel, text in files.items():
            path = Path(root) / tier / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
    return Path(root)


def install_build_hooks(build_dir: str, pch_root: str | None, wanted: list[list[str]],
                        narrow_header_dir: str | None = None, split_root: str | None = None,
                        split_wanted: list[list[str]] | None = None) -> None:
    """Wrap ``load_inline`` (inside the sandbox, before the candidate loads).

    The first time a build is made (compile step) its decisions (split build, PCH, narrow CUDA
    header) are written next to it, and the run step repeats them, so both produce the same build
    command (no rebuild). ``wanted`` collects flag sets that had no PCH yet, ``split_wanted`` those
    whose split build's trusted parts are missing (sandbox/split_build.py), for the pool to build.
    """
    from torch.utils import cpp_extension

    original = cpp_extension.load_inline
    signature = inspect.signature(original)

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            _checked(kwargs)
            return original(*args, **kwargs)  # let torch word the error
        call = _checked(bound.arguments, kwargs)
        call["use_pch"] = False  # torch's own PCH lives in site-packages, shared by all: never
        name = str(call["name"])
        decision_file = Path(build_dir) / f"{name}.pch.json"
        decision = json.loads(decision_file.read_text()) if decision_file.exists() else None
        from sandbox import split_build  # here: it imports this module

        if decision is None:
            split = split_build.first(call, split_root, build_dir, split_wanted)
            if split is not None and split[1] is not None:
                _record(decision_file, {"split_build": split[0], "pch_dir": None, "build_name": name,
                                        "narrow_cuda_header": None}, call)
                return split[1]
        elif decision.get("split_build") not in (None, "fallback"):  # the run step: the same split module
            return split_build.again(call, decision["split_build"], build_dir)
        if decision is None:  # first build: the narrow tiers in order, then the header as written
            decision = {"pch_dir": _pch_for(call, pch_root, wanted), "build_name": name, "narrow_cuda_header": None,
                        "split_build": "fallback" if split is not None else None}
            attempts = [(str(Path(narrow_header_dir) / t), name if i == 0 else f"{name}_{t}hdr")  # type: ignore[arg-type]
                        for i, t in enumerate(NARROW_TIERS)] if _narrow_header_applies(call, narrow_header_dir) else []
            attempts.append((None, name + FULL_HEADER_SUFFIX if attempts else name))
        else:  # the run step: the compile step's choice, so the same build command (no rebuild)
            attempts = [(decision.get("narrow_cuda_header"), decision.get("build_name", name))]
        build = dict(call)
        if decision.get("pch_dir"):
            # through extra_cflags: g++ (main.cpp) only; nvcc never sees the PCH dir
            build["extra_cflags"] = [f"-I{decision['pch_dir']}"] + list(call.get("extra_cflags") or [])
        for k, (header_dir, build_name) in enumerate(attempts):
            # each attempt under its own name: its own build dir and version counter
            attempt = dict(build, name=build_name)
            if header_dir:
                attempt["extra_cuda_cflags"] = [f"-I{header_dir}"] + list(call.get("extra_cuda_cflags") or [])
            decision = {**decision, "narrow_cuda_header": header_dir, "build_name": build_name}
            if k == len(attempts) - 1:
                _record(decision_file, decision, call)
                return original(**attempt)
            try:
                module = original(**attempt)
            except Exception:  # noqa: BLE001 - whatever the narrow header lacked: the next, wider one
                if _cuda_object_built(attempt):
                    raise  # the .cu compiled: the header is not what failed (main.cpp, the link)
                continue
            _record(decision_file, decision, call)
            return module
        raise AssertionError("unreachable: the last attempt returns or raises")

    load_inline.__wrapped__ = original  # type: ignore[attr-defined]
    cpp_extension.load_inline = load_inline

    original_load = inspect.unwrap(cpp_extension.load)  # a fresh wrapper, never one around another
    load_signature = inspect.signature(original_load)

    def load(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = load_signature.bind(*args, **kwargs)
        except TypeError:
            _checked(kwargs)
            return original_load(*args, **kwargs)
        return original_load(**_checked(bound.arguments, kwargs))

    load.__wrapped__ = original_load  # type: ignore[attr-defined]
    cpp_extension.load = load


def _checked(arguments: Any, keywords: dict[str, Any] | None = None) -> dict[str, Any]:
    """The call's arguments once :func:`sandbox.flags.check_build_call` accepts them (and the
    keywords as given, should the signature gather some under ``**kwargs``), with the flag lists
    copied to plain lists (what was checked is what is built); RuntimeError otherwise."""
    call = dict(arguments)
    problems = check_build_call({**call, **(keywords or {})})
    if problems:
        raise RuntimeError(f"{DISALLOWED_MESSAGE}: " + "; ".join(problems[:5]))
    for key in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags"):
        if call.get(key) is not None:
            call[key] = list(call[key])
    return call


def _pch_for(call: dict[str, Any], pch_root: str | None, wanted: list[list[str]]) -> str | None:
    if not pch_root or call.get("no_implicit_headers"):
        return None
    if not pch_allowed(call.get("extra_cflags") or []):
        return None  # not a project flag set: built without a PCH, and never reported
    extra = pch_flags(call.get("extra_cflags") or []) or []
    candidate = Path(pch_root) / pch_key(extra)
    if _pch_complete(candidate):
        return str(candidate)
    wanted.append(extra)
    return None


def _cuda_object_built(call: dict[str, Any]) -> bool:
    """Did nvcc produce cuda.cuda.o in this call's build dir? Unsure counts as no (retry)."""
    root = call.get("build_directory") or (
        os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], str(call["name"])) if os.environ.get("TORCH_EXTENSIONS_DIR")
        else None)
    return bool(root) and (Path(root) / "cuda.cuda.o").is_file()


def _is_cuda_call(call: dict[str, Any]) -> bool:
    return bool(call.get("cuda_sources"))


def _narrow_header_applies(call: dict[str, Any], narrow_header_dir: str | None) -> bool:
    if not narrow_header_dir or not _is_cuda_call(call) or call.get("no_implicit_headers"):
        return False
    sources = call["cuda_sources"]
    text = sources if isinstance(sources, str) else "\n".join(str(s) for s in sources)
    return not any(marker in text for marker in _NEEDS_FULL_HEADER)


def _record(decision_file: Path, decision: dict[str, Any], call: dict[str, Any]) -> None:
    try:
        decision_file.write_text(json.dumps({**decision, "extra_cflags": [str(f) for f in call.get("extra_cflags") or []]}))
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the precompiled torch/extension.h for one flag set.")
    ap.add_argument("--pch-root", required=True)
    ap.add_argument("--cflags", default="[]", help="JSON list of extra_cflags")
    a = ap.parse_args(argv)
    cflags = json.loads(a.cflags)
    if not pch_allowed(cflags):  # before anything is created: the request may be forged
        raise ValueError(f"no PCH for extra_cflags {cflags!r}: not one of sandbox.build.PCH_FLAG_SETS")
    Path(a.pch_root).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out = build_pch(a.pch_root, cflags)
    print(json.dumps({"pch_dir": str(out), "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
