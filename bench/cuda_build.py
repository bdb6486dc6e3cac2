"""Cold build cost of a KernelBench-style CUDA ``load_inline``, object by object, under the ways the
sandbox can build it: torch's plain build, with the precompiled torch/extension.h for main.cpp,
and with that plus the narrow headers nvcc tries first (sandbox/build.py: the "min" tier for
torch/types.h, then torch/types.h alone; the row's ``header_tier`` says which one built).

Each build is a fresh process and a fresh extensions dir, through the sandbox's own
``install_build_hooks`` and ``protocol.build_candidate`` (what a compile step runs, minus the
confinement). Per-object times come from ninja's own log (``.ninja_log``). ninja runs main.cpp
and cuda.cu side by side (``--jobs`` >= 2), so a cold build costs about the slower of the two
plus the link. On a machine without a CUDA torch (the CPU box) the objects compile and the link
fails for want of libtorch_cuda: the object times are still real, the total is reported as
"objects only".

    python -m bench.cuda_build --out runs/bench/cuda_build.json              # CPU box or GPU
    CUDA_HOME=/usr/local/cuda python -m bench.cuda_build --modes narrow --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ninja_seconds, parser, percentile, progress, report
from sandbox.build import FULL_HEADER_SUFFIX

MODES = {  # name: (precompiled header for main.cpp, narrow header for cuda.cu)
    "torch": (False, False),
    "pch": (True, False),
    "narrow": (True, True),
}


def build_once(src: str, mode: str, root: Path, pch_root: Path | None, narrow_dir: Path) -> dict[str, Any]:
    """One cold build in a child process; returns its wall time and ninja's per-object times."""
    use_pch, use_narrow = MODES[mode]
    ext_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=root))
    job = {"src": src, "ext_dir": str(ext_dir), "pch_root": str(pch_root) if use_pch and pch_root else None,
           "narrow_dir": str(narrow_dir) if use_narrow else None}
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.cuda_build", "--child", json.dumps(job)],
                          capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    child = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {"error": proc.stderr[-500:]}
    objects = ninja_times(ext_dir)
    return {"mode": mode, "wall_s": wall, "linked": child.get("ok", False),
            "error": None if child.get("ok") else (child.get("error") or "")[-300:], **objects}


def ninja_times(ext_dir: Path) -> dict[str, float]:
    """Seconds per object (main.o, cuda.cuda.o) from the newest build dir's .ninja_log."""
    out = ninja_seconds(ext_dir, lambda target: {"main.o": "main_cpp_s", "cuda.cuda.o": "cuda_cu_s"}.get(target, "link_s"))
    names = [d.name for d in ext_dir.iterdir()]
    # which header tier the build ended on (sandbox/build.py tries "min", then "types", then the real one)
    out["header_tier"] = ("full" if any(n.endswith(FULL_HEADER_SUFFIX) for n in names) else
                          "types" if any(n.endswith("_typeshdr") for n in names) else "min")
    return out


def child(job: dict[str, Any]) -> None:
    import torch
    from torch.utils import cpp_extension

    from sandbox import build, protocol

    if not torch.version.cuda and os.environ.get("CUDA_HOME"):
        cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # a CPU torch never looks for nvcc itself

    build.install_build_hooks(job["ext_dir"], job["pch_root"], [], job["narrow_dir"])
    try:
        protocol.build_candidate(job["src"], job["ext_dir"])
        print(json.dumps({"ok": True}))
    except protocol.StepError as exc:
        print(json.dumps({"ok": False, "error": exc.message}))


def solutions() -> list[tuple[str, str]]:
    from rewards.solutions import available, load_solution

    return [(t, load_solution("cuda", t)) for t in available("cuda")]


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of {sorted(MODES)}")
    p.add_argument("--repeats", type=int, default=1, help="cold builds per solution and mode")
    p.add_argument("--jobs", type=int, default=4, help="ninja jobs per build (MAX_JOBS)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    os.environ["MAX_JOBS"] = str(args.jobs)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    from sandbox import build

    root = Path(tempfile.mkdtemp(prefix="bench_cuda_build_"))
    narrow = build.write_narrow_header(root / "narrow")
    _cpu_torch_headers(root)
    modes = args.modes.split(",")
    pch_root, pch_s = None, None
    if any(MODES[m][0] for m in modes):
        pch_root = root / "pch"
        pch_root.mkdir()
        t0 = time.perf_counter()
        build.build_pch(pch_root, [])  # the solutions pass no extra_cflags
        pch_s = time.perf_counter() - t0
        print(f"[bench.cuda_build] precompiled header built in {pch_s:.1f}s", flush=True)
    rows, runs = [], []
    for mode in modes:
        for task_id, src in solutions():
            for k in range(args.repeats):
                r = build_once(f"# bench build {mode} {k}\n{src}", mode, root, pch_root, narrow)
                runs.append({"task": task_id, **r})
                print(f"[bench.cuda_build] {mode} {task_id}: {json.dumps(r)}", flush=True)
        mine = [r for r in runs if r["mode"] == mode]
        row = {"mode": mode, "builds": len(mine), "linked": sum(r["linked"] for r in mine)}
        for key in ("main_cpp_s", "cuda_cu_s", "wall_s"):
            vals = [r[key] for r in mine if key in r]
            row[f"{key[:-2]} p50 s"] = percentile(vals, 50)
            row[f"{key[:-2]} max s"] = max(vals) if vals else float("nan")
        rows.append(row)
        progress("cuda_build", row)
    report("cuda_build", args, rows, {"pch_build_s": pch_s, "jobs": args.jobs, "runs": runs,
                                      "note": None if any(r["linked"] for r in runs) else
                                      "objects only: this torch cannot link CUDA extensions"})


def _cpu_torch_headers(root: Path) -> None:
    """CPU torch wheels ship c10/cuda without its generated cuda_cmake_macros.h (one macro): add it
    through CPATH so nvcc and g++ find it, on such machines only."""
    import torch

    if torch.version.cuda:
        return
    shim = root / "cpu_torch_shim"
    (shim / "c10" / "cuda" / "impl").mkdir(parents=True)
    (shim / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text(
        "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    os.environ["CPATH"] = f"{shim}:{os.environ['CPATH']}" if os.environ.get("CPATH") else str(shim)
    if not os.environ.get("CUDA_HOME"):  # torch looks for nvcc's root; a wrapper script on PATH hides it
        roots = sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))
        if roots:
            os.environ["CUDA_HOME"] = str(roots[-1].parent.parent)


if __name__ == "__main__":
    main()
