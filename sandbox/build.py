"""Compile cache keys and the precompiled header of torch/extension.h.

Most of a cold ``load_inline`` is g++ parsing torch/extension.h. A precompiled header (PCH) of it,
built once per set of ``extra_cflags`` by the trusted pool (never inside a sandbox, so no candidate
can plant one), cuts that. Inside the sandbox, :func:`install_build_hooks` wraps ``load_inline``:
when a PCH for the call's flags exists, its directory is put first on the include path (g++ then
takes ``torch/extension.h.gch`` in place of the header). The candidate's source and flags are
unchanged, so the built module is the same.

``python -m sandbox.build --pch-root DIR --cflags '<json list>'`` builds one PCH (the pool runs it).
"""
from __future__ import annotations

import argparse
import hashlib
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

PCH_HEADER = "torch/extension.h"


def build_key(candidate_src: str, backend: str, arch: str, torch_version: str) -> str:
    """Content address of a candidate's build."""
    h = hashlib.sha256()
    for part in (candidate_src, backend, arch, torch_version, sys.version):
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
    """Build the PCH for ``extra_cflags`` under ``pch_root/<key>`` (atomic rename); returns the dir."""
    from torch.utils import cpp_extension

    final = Path(pch_root) / pch_key(extra_cflags)
    if (final / (PCH_HEADER + ".gch")).exists():
        return final
    tmp = Path(tempfile.mkdtemp(dir=pch_root, prefix=".building-"))
    out = tmp / (PCH_HEADER + ".gch")
    out.parent.mkdir(parents=True)
    header = Path(cpp_extension.include_paths()[0]) / PCH_HEADER
    cmd = [_compiler(), "-x", "c++-header", str(header), "-o", str(out)] + pch_cflags(extra_cflags)
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout_s)
        (tmp / "pch.json").write_text(json.dumps({"extra_cflags": extra_cflags, "cmd": cmd, "built": time.time()}))
        try:
            tmp.rename(final)
        except OSError:  # another builder won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def install_build_hooks(build_dir: str, pch_root: str | None, wanted: list[list[str]]) -> None:
    """Wrap ``load_inline`` (inside the sandbox, before the candidate loads).

    The first time a build is made (compile step) the PCH decision is written next to it, and the
    run step repeats that decision, so both produce the same build command (no rebuild).
    ``wanted`` collects flag sets that had no PCH yet, for the pool to build.
    """
    from torch.utils import cpp_extension

    original = cpp_extension.load_inline

    def load_inline(name: str, cpp_sources: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["use_pch"] = False  # torch's own PCH lives in site-packages, shared by all: never
        extra = [str(f) for f in (kwargs.get("extra_cflags") or [])]
        decision_file = Path(build_dir) / f"{name}.pch.json"
        pch_dir: str | None = None
        if decision_file.exists():
            pch_dir = json.loads(decision_file.read_text()).get("pch_dir")
        elif pch_root and not kwargs.get("no_implicit_headers"):
            candidate = Path(pch_root) / pch_key(extra)
            if (candidate / (PCH_HEADER + ".gch")).exists():
                pch_dir = str(candidate)
            else:
                wanted.append(extra)
            try:
                decision_file.write_text(json.dumps({"pch_dir": pch_dir, "extra_cflags": extra}))
            except OSError:
                pass
        if pch_dir:
            kwargs["extra_include_paths"] = [pch_dir] + list(kwargs.get("extra_include_paths") or [])
        return original(name, cpp_sources, *args, **kwargs)

    cpp_extension.load_inline = load_inline


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the precompiled torch/extension.h for one flag set.")
    ap.add_argument("--pch-root", required=True)
    ap.add_argument("--cflags", default="[]", help="JSON list of extra_cflags")
    a = ap.parse_args(argv)
    Path(a.pch_root).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out = build_pch(a.pch_root, json.loads(a.cflags))
    print(json.dumps({"pch_dir": str(out), "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
