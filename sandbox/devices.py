"""The GPUs a pool sees (index, compute capability, memory) and what a run step reserves on one
before its task has measured its peaks (sandbox/footprint.py's estimate from the judge's report).
nvidia-smi is asked, not torch: the pool's process never imports torch or starts CUDA.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from typing import Any

from sandbox.config import SandboxConfig


def detect_gpus() -> list[tuple[int, str]]:
    """(index, compute capability) of each visible GPU, from nvidia-smi; [] without one."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        idx, _, cap = line.partition(",")
        if idx.strip().isdigit():
            gpus.append((int(idx), cap.strip()))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        keep = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        gpus = [g for g in gpus if g[0] in keep]
    return gpus


def estimate(fp: dict[str, Any], cfg: SandboxConfig) -> int | None:
    """Bytes to admit a step on from the judge's meta-device footprint (sandbox.footprint)."""
    from sandbox.footprint import Footprint, step_estimate

    try:
        parts = [int(fp[k]) for k in ("input_bytes", "param_bytes", "output_bytes", "input_sets")]
        peak = None if fp.get("peak_bytes") is None else int(fp["peak_bytes"])
    except (KeyError, TypeError, ValueError):
        return None
    if min(parts) < 0 or (peak is not None and peak < 0):
        return None
    return step_estimate(Footprint(*parts[:3], peak), parts[3], cfg.gpu_flush_bytes, cfg.poison_bytes,
                         cfg.gpu_context_bytes)


def gpu_memory() -> dict[int, int]:
    """Total memory of each GPU by nvidia-smi index; {} without one."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    try:
        out = subprocess.run([exe, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return {}
    found = {}
    for line in out.strip().splitlines():
        idx, _, mib = line.partition(",")
        try:
            found[int(idx)] = int(float(mib)) * 2**20
        except ValueError:
            continue
    return found


@functools.lru_cache(maxsize=1)
def interpreter_problem() -> str | None:
    """Why Triton's interpreter (the triton backend without a GPU) would score correct answers as
    crashes here, or None. Triton 3.6 and older turn a loop bound that is a kernel argument
    (``for start in range(0, n, BLOCK)``) into ``int()`` of a one-element array, which numpy 2.4
    refuses ("only 0-dimensional arrays can be converted to Python scalars"; seen 2026-12-05 with
    numpy 2.4.6 and triton 3.3.1, 3.5.1 and 3.6.0, torch 2.11's pin; triton 3.7.0 to 3.9.0 with
    numpy 2.4.6, and triton 3.6.0 with numpy 2.3.5, run it).
    Versions are read from the installed metadata: the pool's process imports neither."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        triton, numpy = version("triton"), version("numpy")
    except PackageNotFoundError:
        return None  # no triton: the step itself reports the missing module
    if _major_minor(triton) < (3, 7) and _major_minor(numpy) >= (2, 4):
        return (f"the triton backend without a GPU runs Triton's interpreter, and triton {triton} with "
                f"numpy {numpy} fails on any loop whose bound is a kernel argument, so correct answers "
                f"would score as crashes: install numpy<2.4, or triton>=3.7 (a torch that pins triton "
                f"3.6 or older, as torch 2.11 does, needs the numpy)")
    return None


def _major_minor(v: str) -> tuple[int, int]:
    parts = [int(p) if p.isdigit() else 0 for p in (v.split(".") + ["0", "0"])[:2]]
    return parts[0], parts[1]
