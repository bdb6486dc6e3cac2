"""Which compiler and linker arguments an answer may give ``load_inline`` / ``load``.

An answer's ``extra_cflags`` reach g++ (inside the sandbox, and once reached a trusted
precompiled-header build outside it: ``-wrapper /bin/sh,<file>`` ran a shell script there), its
``extra_cuda_cflags`` reach nvcc and its ``extra_ldflags`` the linker. torch writes them into a
ninja file joined by spaces, unquoted, so one list element may also smuggle several arguments.
Everything here is therefore an allowlist: each argument must match one entry, in full (so no
whitespace, quotes, ``$``, paths or response files), or the call is refused. The entries are what
kernels need to be fast (optimisation, target ISA, math modes, macros, warnings, ptxas options);
nothing that names a file, a directory, another program, a plugin, or extra output.

:func:`check_build_call` takes the arguments of one call (names as in ``load_inline``'s signature)
and returns its problems, each naming the argument and why (empty: the call may go ahead).
``sandbox.build`` runs it before any build and ``rewards.rules`` runs it on an answer's literal
arguments. This module imports nothing of the project.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

# ---- g++ (extra_cflags; also what nvcc's -Xcompiler may pass on) --------------------------------
_ARCH_NAMES = ("native|x86-64|x86-64-v2|x86-64-v3|x86-64-v4|haswell|broadwell|skylake|skylake-avx512|"
               "cascadelake|cooperlake|icelake-client|icelake-server|tigerlake|sapphirerapids|alderlake|"
               "emeraldrapids|graniterapids|znver1|znver2|znver3|znver4|znver5|armv8-a|armv8\\.2-a|armv8\\.4-a|"
               "armv9-a|neoverse-n1|neoverse-n2|neoverse-v1|neoverse-v2")
_MACRO = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
_MACRO_VALUE = r"[A-Za-z0-9_.+-]{0,64}"  # numbers, identifiers, 1.5f, -1: no quotes, spaces, slashes, commas
GXX_ALLOWED: dict[str, str] = {
    # optimisation level and loop / math transformations
    "optimisation": r"-O[0-3sg]?|-Ofast|-ffast-math|-funroll-loops|-funroll-all-loops|-fno-math-errno|"
                    r"-fno-trapping-math|-ffp-contract=(fast|on|off)|-ftree-vectorize|-fno-tree-vectorize|"
                    r"-fomit-frame-pointer|-f(no-)?strict-aliasing|-fno-signed-zeros|-freciprocal-math|"
                    r"-ffinite-math-only|-fno-finite-math-only",
    # OpenMP / threads (the runtime is linked with the same flag in extra_ldflags)
    "parallelism": r"-fopenmp|-fopenmp-simd|-pthread",
    # target ISA: a known CPU name, or single ISA extensions
    "target": rf"-march=({_ARCH_NAMES})|-mtune=({_ARCH_NAMES}|generic)|-mcpu=({_ARCH_NAMES})|"
              r"-m(avx|avx2|avx512[a-z0-9]{1,8}|avxvnni|fma|f16c|bmi|bmi2|popcnt|lzcnt|sse[234](\.[12])?|"
              r"ssse3|amx-(tile|int8|bf16|fp16))",
    # language standard, code model, debug info off
    "language": r"-std=(c|gnu)\+\+(14|17|20|2a|23|2b)|-fPIC|-fpic|-g0",
    # macros (conservative names and values)
    "macros": rf"-D{_MACRO}(={_MACRO_VALUE})?|-U{_MACRO}",
    # warnings (never -Werror, never -W<letter>,<args> which hands arguments to other tools)
    "warnings": r"-w|-Wall|-Wextra|-Wno-[a-z0-9][a-z0-9+-]{0,63}",
}

# ---- nvcc (extra_cuda_cflags) -------------------------------------------------------------------
_SM = r"(sm|compute)_\d{2,3}[af]?"
_GENCODE = rf"arch=compute_\d{{2,3}}[af]?,code=({_SM}|\[{_SM}(,{_SM})*\])"
_PTXAS_INNER = re.compile(r"-v|--verbose|-O[0-3]|-dlcm=(ca|cg|cs)|-dscm=(cg|cs|wb|wt)|--warn-on-spills|"
                          r"-warn-spills|--warn-on-local-memory-usage|-warn-lmem-usage|"
                          r"--allow-expensive-optimizations=(true|false)|--maxrregcount=\d{1,3}")
NVCC_ALLOWED: dict[str, str] = {
    # optimisation and math modes
    "optimisation": r"-O[0-3]|--?use_fast_math|--?ftz=(true|false)|--?prec-div=(true|false)|"
                    r"--?prec-sqrt=(true|false)|--?fmad=(true|false)|--?extra-device-vectorization|"
                    r"--?maxrregcount=\d{1,3}",
    # target GPU (the one-token forms; "-arch sm_90" and "-gencode arch=...,code=..." are two-token)
    "target": rf"(-arch|--gpu-architecture)=({_SM}|native|all|all-major)|(-code|--gpu-code)=({_SM})(,{_SM})*|"
              rf"(-gencode|--generate-code)={_GENCODE}",
    # C++ dialect and device lambdas / constexpr
    "language": r"--?std=c\+\+(14|17|20)|--?expt-relaxed-constexpr|--?expt-extended-lambda|--?extended-lambda",
    # diagnostics: line info for profilers, register/resource usage reports, warnings off
    "diagnostics": r"-lineinfo|--generate-line-info|-res-usage|--resource-usage|-w|--disable-warnings|"
                   r"-Wno-deprecated-gpu-targets|-Wno-deprecated-declarations",
    # macros, as for g++
    "macros": GXX_ALLOWED["macros"],
}
# nvcc options that take the next list element as their value (``["-Xptxas", "-v"]``), or "=value",
# and how that value is checked. -Xcompiler values are comma-separated g++ flags, each checked
# against GXX_ALLOWED; -Xptxas values comma-separated ptxas options.
NVCC_WITH_VALUE: dict[str, str] = {
    "-Xptxas": "ptxas", "--ptxas-options": "ptxas",
    "-Xcompiler": "gxx", "--compiler-options": "gxx",
    "-gencode": "gencode", "--generate-code": "gencode",
    "-arch": "arch", "--gpu-architecture": "arch",
    "-maxrregcount": "count", "--maxrregcount": "count",
}

# ---- linker (extra_ldflags) ---------------------------------------------------------------------
# CUDA math libraries, the CUDA runtime/driver, OpenMP, libm and pthreads: found on the default or
# torch's own library path. No -L, -Wl, -Xlinker, rpath, scripts or object files.
LINK_LIBRARIES = ("cublas", "cublasLt", "cudart", "cuda", "curand", "cufft", "cusparse", "cusolver", "gomp", "m",
                  "pthread")
LD_ALLOWED: dict[str, str] = {
    "libraries": "|".join(f"-l{re.escape(name)}" for name in LINK_LIBRARIES),
    "parallelism": r"-fopenmp|-pthread",
}

# How a refused call's error starts (sandbox.build raises it; rewards recognises it in a build log).
DISALLOWED_MESSAGE = "disallowed build argument"

# Arguments that must be absent (None / empty): they point the build at directories.
DENIED_ARGUMENTS = ("extra_include_paths", "build_directory", "extra_sycl_cflags")
# The extension name becomes -DTORCH_EXTENSION_NAME=<name> on the (unquoted) command line and a
# directory name: a Python identifier only.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def _compile(groups: Mapping[str, str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in groups.values()))


_GXX = _compile(GXX_ALLOWED)
_NVCC = _compile(NVCC_ALLOWED)
_LD = _compile(LD_ALLOWED)
_VALUE_CHECKS: dict[str, Callable[[str], bool]] = {
    "ptxas": lambda v: all(_PTXAS_INNER.fullmatch(p) for p in v.split(",")),
    "gxx": lambda v: all(_GXX.fullmatch(p) for p in v.split(",")),
    "gencode": lambda v: re.fullmatch(_GENCODE, v) is not None,
    "arch": lambda v: re.fullmatch(rf"{_SM}|native|all|all-major", v) is not None,
    "count": lambda v: re.fullmatch(r"\d{1,3}", v) is not None,
}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _flag_list(key: str, value: Any, problems: list[str]) -> list[str] | None:
    """The plain strings of one flag argument, or None (with a problem) when it is not a list of str."""
    if value is None:
        return []
    if type(value) not in (list, tuple):
        problems.append(f"{key}: must be a list of strings, not {type(value).__name__}")
        return None
    out = []
    for item in value:
        if type(item) is not str:
            problems.append(f"{key}: {_show(item)} is a {type(item).__name__}, not a string")
            return None
        out.append(item)
    return out


def check_flags(key: str, flags: list[str], tool: str) -> list[str]:
    """Problems of one list of plain strings for ``tool`` ("gxx", "nvcc" or "ld")."""
    pattern = {"gxx": _GXX, "nvcc": _NVCC, "ld": _LD}[tool]
    what = {"gxx": "g++ flag", "nvcc": "nvcc flag", "ld": "linker flag"}[tool]
    problems = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        i += 1
        if flag == "":  # KernelBench's extra_cflags=[""]: adds nothing to the command line
            continue
        if pattern.fullmatch(flag):
            continue
        if tool == "nvcc":
            name, eq, value = flag.partition("=")
            kind = NVCC_WITH_VALUE.get(name)
            if kind is not None:
                if not eq:  # two-token form: the value is the next element
                    if i >= len(flags):
                        problems.append(f"{key}: {_show(flag)} needs a value after it")
                        continue
                    value = flags[i]
                    i += 1
                if _VALUE_CHECKS[kind](value):
                    continue
                problems.append(f"{key}: {_show(flag)} with {_show(value)} is not allowed "
                                f"({name} takes {'allowed g++ flags' if kind == 'gxx' else kind + ' values'} only)")
                continue
        problems.append(f"{key}: {_show(flag)} is not an allowed {what}{_why(flag)}")
    return problems


def _why(flag: str) -> str:
    if flag.startswith("@"):
        return " (a response file reads arguments from a file)"
    if any(c.isspace() for c in flag):
        return " (one element may hold one argument only, no spaces)"
    if flag.startswith(("-I", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-L", "--include-path",
                        "--system-include", "--library-path", "--pre-include")):
        return " (no include or library paths)"
    if flag.startswith(("-Wl", "-Xlinker", "-Wa,", "-Wp,", "-wrapper", "-B", "-specs", "-fplugin", "-ccbin",
                        "--compiler-bindir", "-Xnvlink", "--linker-options")):
        return " (it hands arguments to, or picks, another program)"
    if "/" in flag or "\\" in flag:
        return " (no paths)"
    return " (not on the allowlist in sandbox/flags.py)"


_TOOLS = {"extra_cflags": "gxx", "extra_cuda_cflags": "nvcc", "extra_ldflags": "ld"}


def check_build_call(kwargs: Mapping[str, Any]) -> list[str]:
    """Problems of one ``load_inline`` / ``load`` call's arguments (empty: allowed).

    Only the arguments that reach a compiler or a path are judged: the flag lists (each a list of
    plain strings, each on the allowlist), ``name`` (an identifier), and the denied arguments
    (:data:`DENIED_ARGUMENTS`, which must be absent). ``sources``, ``with_cuda``, ``verbose`` and
    the rest pass.
    """
    problems: list[str] = []
    if "name" in kwargs and not (type(kwargs["name"]) is str and _NAME.fullmatch(kwargs["name"])):
        problems.append(f"name: {_show(kwargs['name'])} must be a Python identifier (it reaches the compiler's "
                        "command line)")
    for key in DENIED_ARGUMENTS:
        value = kwargs.get(key)
        if not (value is None or type(value) in (list, tuple) and len(value) == 0):
            problems.append(f"{key}: not allowed (got {_show(value)}); the build uses the sandbox's own directories")
    for key, tool in _TOOLS.items():
        flags = _flag_list(key, kwargs.get(key), problems)
        if flags:
            problems += check_flags(key, flags, tool)
    return problems
