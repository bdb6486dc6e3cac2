"""The split CUDA build: nvcc never sees a torch header.

A KernelBench-style ``load_inline`` ``.cu`` holds kernels and a torch-using host wrapper; torch
compiles it with nvcc, whose three front ends (cudafe++, cicc, host g++) each parse the torch
header (~21 s of a cold build on the CPU box with the ``min`` tier; the same ``.cu`` without a
torch header 0.7 s; docs/sandbox.md "Compile cost"). Here the ``.cu`` is split in two:

* the **device unit** (nvcc, no torch include path at all): the preprocessor lines that are not
  torch / ATen / c10 / pybind11 includes, every ``__global__`` / ``__device__`` function and
  variable, the types and constants both sides may need, and after each kernel a generated launch
  stub ``void sbx_launch_<kernel>(sbx_launch_config, <the kernel's parameters>)`` doing the
  ``<<<>>>`` launch;
* the **host unit** (g++ on the ``min`` PCH, as the C++ split): the rest of the ``.cu``, every
  ``kernel<<<cfg>>>(args)`` rewritten to ``sbx_launch_<kernel>(sbx_launch_config(cfg), args)``.
  ``sbx_launch_config``'s constructor takes (dim3, dim3, size_t = 0, cudaStream_t = 0), the
  parameters of CUDA's own launch configuration, so the configuration converts exactly as in the
  launch and needs no splitting; the stub's parameters are the kernel's, so the arguments convert
  as in the launch too, and a call that would not compile as a launch does not compile as a call.

The answer's ``cpp_sources`` and the ``PyInit_`` tail (sandbox/split_build.py ``answer_tail``,
bound through the trusted ``libsbx_split.so``) are torch's ``main.cpp``: when ``cpp_sources`` only
declares functions that the ``.cu`` declares or defines before using them (KernelBench answers),
they go first in the host unit (see :func:`units`); otherwise they form a third unit, so that each
keeps its own macros and declarations as under torch (an answer that would not build under torch
does not build here). The units compile in parallel and are linked into one module as torch links
a CUDA extension.

The text is split by :mod:`sandbox.cu_split` (a hand-written scanner; whatever it is not sure of
makes the call fall back to torch's build); a unit that does not compile or link also falls back:
a wrong split can cost time, never a wrong module.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from sandbox import build, split_build
from sandbox.cu_split import IDENT, Doubt, Split, mask, prototypes


def _reserved(text: str) -> list[str]:
    """The ``sbx_`` names the answer's code (not its comments or strings) uses."""
    try:
        code = mask(text)
    except Exception:  # noqa: BLE001 - text the scanner cannot read does not split either (units() says so): no verdict here
        return []
    return sorted({w for w in IDENT.findall(code) if w.startswith("sbx_")})


def applies(call: dict[str, Any]) -> dict[str, str] | None:
    """The functions to bind when a ``load_inline`` call with ``cuda_sources`` may take the CUDA split
    (as :func:`sandbox.split_build.applies`, plus: torch's implicit headers, and nothing that needs
    the full header)."""
    functions = split_build.applies(call, cuda=True)
    if functions is None or call.get("with_cuda") is False:
        return None
    # flags nvcc hands its host compiler would reach the .cu's host code, which g++ compiles here on
    # a PCH of fixed flags; macros (-D / -U) are given to both units instead (commands)
    if any(str(f).strip().startswith(_HOST_COMPILER_FLAGS) for f in call.get("extra_cuda_cflags") or []):
        return None
    # the host unit is compiled with extra_cflags (its PCH's flags): only those that cannot change
    # what the .cu's host code computes or sees (-ffast-math, -fopenmp, -march define macros or change math)
    if not set(build.pch_flags(call.get("extra_cflags") or []) or []) <= {"-O2", "-O3"}:
        return None
    text = "\n".join(_texts(call, "cuda_sources") + _texts(call, "cpp_sources"))
    return None if any(marker in text for marker in build._NEEDS_FULL_HEADER) else functions


_HOST_COMPILER_FLAGS = ("-Xcompiler", "--compiler-options", "-ccbin", "--compiler-bindir", "-I", "--include-path")


def _texts(call: dict[str, Any], key: str) -> list[str]:
    sources = call.get(key) or []
    return [sources] if isinstance(sources, str) else [str(s) for s in sources]


def cuda_home() -> str:
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    return str(home)


def commands(call: dict[str, Any], root: str | Path, out_dir: Path,
             unit_names: tuple[str, ...] = ("device", "host", "main")) -> dict[str, list[str]]:
    """The compile commands of the units and the link, as torch would give them."""
    from torch.utils import cpp_extension

    flags = build.pch_flags(call.get("extra_cflags") or []) or []
    name, home = str(call["name"]), cuda_home()
    cuda_flags = [str(f).strip() for f in call.get("extra_cuda_cflags") or []]
    nvcc = [os.path.join(home, "bin", "nvcc"), *(["-ccbin", os.environ["CC"]] if os.environ.get("CC") else []),
            f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H", *cpp_extension.COMMON_NVCC_FLAGS,
            *cpp_extension._get_cuda_arch_flags(cuda_flags), "--compiler-options", "-fPIC", *cuda_flags]
    if not any(f.startswith("-std=") for f in nvcc):
        nvcc.append("-std=c++20")
    gxx = [build._compiler(), f"-I{split_build.min_pch_dir(root, flags)}", f"-I{Path(root) / 'narrow' / 'min'}",
           f"-DTORCH_EXTENSION_NAME={name}", *build.pch_cflags(flags), "-isystem", os.path.join(home, "include"),
           "-Winvalid-pch"]
    macros = [f for f in cuda_flags if f.startswith(("-D", "-U"))]  # the .cu's macros reach its host code too
    lib_dir = Path(root) / split_build.runtime_key()
    lib_path = "lib64" if os.path.isdir(os.path.join(home, "lib64")) else "lib"
    torch_lib = cpp_extension.library_paths()[0]
    link = [build._compiler(), "-shared", *(str(f) for f in call.get("extra_ldflags") or []), f"-L{torch_lib}", "-lc10",
            "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", "-ltorch", "-ltorch_python", f"-L{lib_dir}", "-lsbx_split",
            f"-Wl,-rpath,{lib_dir}", f"-L{os.path.join(home, lib_path)}", "-lcudart"]
    cmds = {"device": [*nvcc, "-c", str(out_dir / "device.cu"), "-o", str(out_dir / "device.o")],
            "host": [*gxx, *macros, "-c", "-x", "c++", str(out_dir / "host.cpp"), "-o", str(out_dir / "host.o")],
            "main": [*gxx, "-c", str(out_dir / "main.cpp"), "-o", str(out_dir / "main.o")]}
    return {**{u: cmds[u] for u in unit_names},
            "link": [*link[:2], *(str(out_dir / f"{u}.o") for u in unit_names), *link[2:],
                     "-o", str(split_build.module_path(out_dir.parent, name))]}


def units(call: dict[str, Any], functions: dict[str, str]) -> dict[str, str]:
    """The units' text (device, host, and main unless it joins host); :class:`Doubt` when the
    ``.cu`` cannot be split with certainty.

    torch's main.cpp (``cpp_sources`` and the binding) is a unit of its own, ~1.8 CPU s on the
    PCH whatever it holds (an empty unit costs 1.7 s: the header's inline code instantiated at the
    end of every unit). When ``cpp_sources`` only declares functions (KernelBench answers do) and
    the ``.cu``'s host code declares or defines each of them before any other use, it and the tail
    go first in the host unit instead: the tail sees exactly the declarations main.cpp would, the
    ``.cu``'s macros come after it, and the ``.cu``'s code sees nothing it would not have seen
    itself (every declared function it uses is its own, declared first)."""
    split = Split("\n".join(_texts(call, "cuda_sources")))
    cpp = "\n".join(_texts(call, "cpp_sources")) + "\n"
    tail = split_build.answer_tail(str(call["name"]), functions)
    declared = prototypes(cpp)
    macros = any(str(f).strip().startswith(("-D", "-U")) for f in call.get("extra_cuda_cflags") or [])
    if declared is not None and not macros and all(split.declared_before_use(f) for f in declared):
        return {"device": split.device, "host": "#include <torch/extension.h>\n" + cpp + tail + split.host}
    return {"device": split.device, "host": "#include <torch/extension.h>\n" + split.host,
            "main": "#include <torch/extension.h>\n" + cpp + tail}


def build_module(call: dict[str, Any], functions: dict[str, str], root: str | Path, build_dir: str | Path,
                 times: dict[str, float] | None = None) -> Path | None:
    """Compile the units in parallel and link them; None when the answer does not split or a
    unit does not compile or link this way (the caller builds it torch's way). Raises
    :class:`sandbox.split_build.ReservedSymbol` for an answer that names or defines an ``sbx_`` symbol.
    ``times`` receives each unit's seconds (the bench)."""
    name = str(call["name"])
    reserved = _reserved("\n".join(_texts(call, "cuda_sources") + _texts(call, "cpp_sources")))
    if reserved:
        raise split_build.ReservedSymbol(f"Error building extension '{name}': the answer names reserved "
                                         f"symbol(s) {', '.join(reserved[:5])} (the sbx_ prefix is the sandbox's)")
    try:
        texts = units(call, functions)
    except Exception:  # noqa: BLE001 - Doubt, or a scanner error on text it did not foresee: a doubt too
        return None
    out = split_build.module_path(build_dir, name)
    cmds = commands(call, root, out.parent, tuple(texts))
    stamp = hashlib.sha256(json.dumps([texts, cmds]).encode()).hexdigest()
    stamp_file = out.parent / "stamp"
    if out.is_file() and stamp_file.is_file() and stamp_file.read_text() == stamp:
        return out
    stamp_file.unlink(missing_ok=True)
    times = {} if times is None else times
    try:
        if not compile_objects(call, texts, cmds, out.parent, times):
            return None
        t1 = time.perf_counter()
        proc = subprocess.run(cmds["link"], capture_output=True, text=True)
        times["link_s"] = time.perf_counter() - t1
        (out.parent / "link.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            return None
    finally:  # what each part took (bench/cuda_build.py reads it; a few bytes)
        (out.parent / "times.json").write_text(json.dumps(times))
    stamp_file.write_text(stamp)
    return out


def compile_objects(call: dict[str, Any], texts: dict[str, str], cmds: dict[str, list[str]], out_dir: Path,
                    times: dict[str, float] | None = None) -> bool:
    """The units compiled side by side into ``out_dir``; False when one does not compile or the
    host unit calls a launch stub the device unit does not define (the same mangled type). Raises
    :class:`sandbox.split_build.ReservedSymbol` for an object defining an ``sbx_`` symbol."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for unit, text in texts.items():
        (out_dir / ("device.cu" if unit == "device" else f"{unit}.cpp")).write_text(text)
    t0 = time.perf_counter()
    procs = {}
    for unit in texts:
        with open(out_dir / f"{unit}.log", "w") as log:  # a file, not a pipe: nothing blocks on a long error
            procs[unit] = subprocess.Popen(cmds[unit], stdout=log, stderr=subprocess.STDOUT)
    ok = True
    for unit, proc in procs.items():  # all waited for: none left running behind a fallback
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        ok = ok and proc.returncode == 0
        if times is not None:  # the bench: when each finished (from the common start) and its CPU seconds
            times[f"{unit}_s"], times[f"{unit}_cpu_s"] = time.perf_counter() - t0, usage.ru_utime + usage.ru_stime
        if call.get("verbose") and proc.returncode:
            print((out_dir / f"{unit}.log").read_text()[-4000:])
    if not ok:
        return False
    symbols = {u: _symbols(out_dir / f"{u}.o") for u in texts}
    bad = sorted({s for defined, _ in symbols.values() for s in defined if s.startswith("sbx_")})
    if bad:
        raise split_build.ReservedSymbol(f"Error building extension '{call['name']}': the answer defines reserved "
                                         f"symbol(s) {', '.join(bad[:5])} (the sbx_ prefix is the trusted library's)")
    return stubs_match(symbols["host"][1], symbols["device"][0])


def _symbols(obj: Path) -> tuple[set[str], set[str]]:
    """(defined, undefined) global symbols of an object, as the linker sees them (mangled)."""
    nm = subprocess.run(["nm", "-g", "-P", str(obj)], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in nm.splitlines() if line.strip()]
    return {r[0] for r in rows if r[1] != "U"}, {r[0] for r in rows if r[1] == "U"}


def stubs_match(host_undefined: set[str], device_defined: set[str]) -> bool:
    """Every launch stub the host unit calls is defined, with the same mangled type, by the device unit."""
    return all(s in device_defined for s in host_undefined if "sbx_launch_" in s)
