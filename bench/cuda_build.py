"""Cold build cost of a KernelBench-style CUDA ``load_inline``, object by object, under the ways the
sandbox can build it: torch's plain build, with the precompiled torch/extension.h for main.cpp,
and with that plus the narrow headers nvcc tries first (sandbox/build.py: the "min" tier for
torch/types.h, then torch/types.h alone; the row's ``header_tier`` says which one built).

Mode ``split`` is the split CUDA build (sandbox/split_cuda.py: the kernels by nvcc without any
torch header, the host code and the answer's ``cpp_sources`` by g++ on the ``min`` PCH, three
objects in parallel, one link); its trusted parts are built first, once.

Each build is a fresh process and a fresh extensions dir, through the sandbox's own
``install_build_hooks`` and ``protocol.build_candidate`` (what a compile step runs, minus the
confinement). Per-object times come from ninja's own log (``.ninja_log``), or for ``split`` from
the times the split build records (each object's finish from the common start; ``objects_s`` is
when the last object was done, in every mode). ninja runs main.cpp and cuda.cu side by side
(``--jobs`` >= 2), so a cold build costs about the slower of the two plus the link. ``cpu_s`` is
the whole build process's CPU time (its torch import included). Modes take turns (interleaved,
per batch of ``--parallel`` builds of distinct answers running at once), so both see the same load.
On a machine without a CUDA torch (the CPU box) the objects compile and the link fails for want
of libtorch_cuda: the object times are still real, the total is reported as "objects only"
(``split`` there compiles the three objects and stops at the failed link, no fallback).

    python -m bench.cuda_build --out runs/bench/cuda_build.json              # CPU box or GPU
    CUDA_HOME=/usr/local/cuda python -m bench.cuda_build --modes narrow --repeats 3
    python -m bench.cuda_build --modes narrow,split --answers all --parallel 8 --repeats 2   # 16-core GPU box
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import ninja_seconds, parser, percentile, progress, report
from sandbox.build import FULL_HEADER_SUFFIX

MODES = {  # name: (precompiled header for main.cpp, narrow header for cuda.cu, split build)
    "torch": (False, False, False),
    "pch": (True, False, False),
    "narrow": (True, True, False),
    "split": (True, True, True),  # a call that does not split falls back to "narrow"
}


def build_once(src: str, mode: str, root: Path, pch_root: Path | None, narrow_dir: Path,
               split_root: Path | None = None) -> dict[str, Any]:
    """One cold build in a child process; returns its wall and CPU time and the per-object times."""
    use_pch, use_narrow, use_split = MODES[mode]
    ext_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=root))
    job = {"src": src, "ext_dir": str(ext_dir), "pch_root": str(pch_root) if use_pch and pch_root else None,
           "narrow_dir": str(narrow_dir) if use_narrow else None, "split_root": str(split_root) if use_split else None}
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.cuda_build", "--child", json.dumps(job)],
                          capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    out = proc.stdout.strip()
    child = json.loads(out.splitlines()[-1]) if out else {"error": proc.stderr[-500:]}
    objects = split_times(ext_dir) if use_split else ninja_times(ext_dir)
    return {"mode": mode, "wall_s": wall, "cpu_s": child.get("cpu_s"),
            "linked": child.get("ok", False), "split_used": child.get("split_used"),
            "error": None if child.get("ok") else (child.get("error") or "")[-300:], **objects}


def split_times(ext_dir: Path) -> dict[str, Any]:
    """The split build's own record (sandbox/split_cuda.py writes times.json beside its objects)."""
    found = sorted(ext_dir.glob("*_split/times.json"))
    t = json.loads(found[0].read_text()) if found else {}
    out = {k: t[k] for k in ("device_s", "host_s", "main_s", "link_s", "device_cpu_s", "host_cpu_s", "main_cpu_s") if k in t}
    if "device_s" in t and "host_s" in t:  # main_s only where main.cpp is a unit of its own
        out["objects_s"] = max(t["device_s"], t["host_s"], t.get("main_s", 0.0))
    return out


def ninja_times(ext_dir: Path) -> dict[str, float]:
    """Seconds per object (main.o, cuda.cuda.o) from the newest build dir's .ninja_log."""
    out = ninja_seconds(ext_dir, lambda target: {"main.o": "main_cpp_s", "cuda.cuda.o": "cuda_cu_s"}.get(target, "link_s"))
    names = [d.name for d in ext_dir.iterdir()]
    # which header tier the build ended on (sandbox/build.py tries "min", then "types", then the real one)
    out["header_tier"] = ("full" if any(n.endswith(FULL_HEADER_SUFFIX) for n in names) else
                          "types" if any(n.endswith("_typeshdr") for n in names) else "min")
    if "main_cpp_s" in out and "cuda_cu_s" in out:
        out["objects_s"] = max(out["main_cpp_s"], out["cuda_cu_s"])
    return out


def child(job: dict[str, Any]) -> None:
    import resource

    import torch
    from torch.utils import cpp_extension

    from sandbox import build, protocol, split_cuda

    if not torch.version.cuda and os.environ.get("CUDA_HOME"):
        cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # a CPU torch never looks for nvcc itself

    def cpu_s() -> float:  # this process and the compilers it waited for (ninja, nvcc, g++), torch's import included
        return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))

    def done(result: dict[str, Any]) -> None:
        print(json.dumps({**result, "cpu_s": cpu_s()}), flush=True)

    if job["split_root"] and not torch.version.cuda:  # no link here: the objects, then stop (no fallback)
        from unittest import mock

        calls: list[dict[str, Any]] = []
        with mock.patch.object(cpp_extension, "load_inline", lambda **kw: calls.append(kw) or mock.MagicMock()):
            exec(compile(job["src"], "answer", "exec"), {"__name__": "answer"})
        functions = split_cuda.applies(calls[0])
        path = split_cuda.build_module(calls[0], functions, job["split_root"], job["ext_dir"]) if functions else None
        used = functions is not None and bool(list(Path(job["ext_dir"]).glob("*_split/device.o")))
        done({"ok": path is not None, "split_used": used, "error": "objects only: no CUDA torch to link"})
        return
    build.install_build_hooks(job["ext_dir"], job["pch_root"], [], job["narrow_dir"], job["split_root"], [])
    try:
        protocol.build_candidate(job["src"], job["ext_dir"])
        decisions = [json.loads(p.read_text()) for p in Path(job["ext_dir"]).glob("*.pch.json")]
        done({"ok": True, "split_used": bool(decisions) and all(
            d.get("split_build") not in (None, "fallback") for d in decisions) if job["split_root"] else None})
    except protocol.StepError as exc:
        done({"ok": False, "error": exc.message})


def solutions(which: str = "solutions") -> list[tuple[str, str]]:
    """The project's CUDA solutions (rewards/corpus fast answers), bench/kernelbench_answers, or both."""
    from rewards.solutions import available, load_solution

    out = [(t, load_solution("cuda", t)) for t in available("cuda")] if which in ("solutions", "all") else []
    if which in ("kernelbench", "all"):
        here = Path(__file__).resolve().parent / "kernelbench_answers"
        out += [(Path(p).stem, Path(p).read_text()) for p in sorted(glob.glob(str(here / "*.py")))]
    return out


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of {sorted(MODES)}")
    p.add_argument("--repeats", type=int, default=1, help="cold builds per solution and mode")
    p.add_argument("--jobs", type=int, default=4, help="ninja jobs per build (MAX_JOBS)")
    p.add_argument("--answers", default="solutions", choices=("solutions", "kernelbench", "all"))
    p.add_argument("--parallel", type=int, default=1, help="builds at once (distinct answers, one mode per batch)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    os.environ["MAX_JOBS"] = str(args.jobs)
    load_before = os.getloadavg()[0]
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
    split_root, split_s = None, None
    if "split" in modes:
        from sandbox import split_build

        split_root = root / "split"
        t0 = time.perf_counter()
        split_build.build_trusted(split_root, [])  # trusted, once: the library and the min PCH
        split_s = time.perf_counter() - t0
        print(f"[bench.cuda_build] split build's trusted parts built in {split_s:.1f}s", flush=True)
    answers = solutions(args.answers)
    jobs = [(task_id, src, k) for k in range(args.repeats) for task_id, src in answers]
    runs: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for b in range(0, len(jobs), args.parallel):  # a batch of distinct answers per mode, modes in turn
            batch = jobs[b:b + args.parallel]
            for mode in modes:
                futures = [(t, pool.submit(build_once, f"# bench build {mode} {k}\n{src}", mode, root, pch_root,
                                           narrow, split_root)) for t, src, k in batch]
                for task_id, f in futures:
                    r = {"task": task_id, **f.result()}
                    runs.append(r)
                    print(f"[bench.cuda_build] {mode} {task_id}: {json.dumps(r)}", flush=True)
    rows = []
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        row = {"mode": mode, "builds": len(mine), "linked": sum(r["linked"] for r in mine),
               "split_used": sum(bool(r.get("split_used")) for r in mine) if mode == "split" else None}
        for key in ("main_cpp_s", "cuda_cu_s", "device_s", "host_s", "main_s", "objects_s", "link_s", "wall_s", "cpu_s"):
            vals = [r[key] for r in mine if r.get(key) is not None]
            if vals:
                row[f"{key[:-2]} p50 s"] = percentile(vals, 50)
                row[f"{key[:-2]} max s"] = max(vals)
        rows.append(row)
        progress("cuda_build", row)
    report("cuda_build", args, rows, {"pch_build_s": pch_s, "split_trusted_s": split_s, "jobs": args.jobs,
                                      "parallel": args.parallel, "load_before": load_before,
                                      "load_after": os.getloadavg()[0], "runs": runs,
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
