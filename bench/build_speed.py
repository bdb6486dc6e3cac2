"""Cold C++ build of distinct answers: torch's plain ``load_inline`` against the sandbox's own build
path, side by side, and where the sandbox build's time goes.

Each of ``--n`` answers is a CPU corpus answer (rewards/corpus/cpu/*/fast.py) made distinct, as RL
samples are, by a constant in its C++ source (so no cache of any kind can serve it). Every answer
is built twice, each time in a fresh process and a fresh extensions dir, the two variants in
alternating order (the box is shared: drift hits both alike):

* ``plain``: the answer's own ``load_inline`` call, as torch runs it (no PCH).
* ``sandbox``: through ``sandbox.build.install_build_hooks`` and ``protocol.build_candidate``,
  what a compile step runs (minus the confinement), with the pool's precompiled header for the
  answer's flag set built beforehand (the steady state of a pool; its one-off cost is reported).
* ``split``: the same hooks with the split build on (``sandbox/split_build.py``: the answer's code
  alone on the ``min`` header's PCH, bound by the trusted library), its trusted parts built
  beforehand (one-off cost reported); no full PCH, so an answer that falls back pays the plain build.

``--breakdown`` then compiles the last sandbox build's ``main.cpp`` again with ``-ftime-report``
(g++'s own phase times), and two cut-down copies of it: the header alone (what every answer pays
for ``torch/extension.h`` even with the PCH) and the answer without torch's pybind11 block (so the
binding's share is the difference). The link time is ninja's (``.ninja_log``).

    python -m bench.build_speed --backend cpu --n 6 --breakdown --out bench/baselines/cpu/build_speed.json
    python -m bench.build_speed --backend cpu --n 4 --variants plain,sandbox,split --out bench/baselines/cpu/build_speed_split.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ninja_seconds, parser, percentile, progress, report

VARIANTS = ("plain", "sandbox", "split")
# g++ -ftime-report lines worth keeping: the phases and the biggest items inside them
_PHASES = ("phase setup", "phase parsing", "phase lang. deferred", "phase opt and generate",
           "template instantiation", "callgraph ipa passes", "callgraph functions expansion", "TOTAL")
_FLAGS_RE = re.compile(r"extra_cflags\s*=\s*(\[[^\]]*\])")


def templates(flags: list[str] | None = None) -> list[tuple[str, str, list[str]]]:
    """(task id, source, extra_cflags) of the CPU corpus answers that build with ``load_inline``;
    with ``flags``, only those that pass exactly these (one PCH serves them all)."""
    import ast

    from rewards.solutions import available, load_solution

    out = []
    for task in available("cpu"):
        src = load_solution("cpu", task)
        m = _FLAGS_RE.search(src)
        if "load_inline" not in src or not m:
            continue
        cflags = [f for f in ast.literal_eval(m.group(1)) if f]
        if flags is None or cflags == flags:
            out.append((task, src, cflags))
    return out


def distinct(src: str, k: int, nonce: str) -> str:
    """The answer with a constant of its own in its C++ source (a new build key, a new object)."""
    marker = "#include <torch/extension.h>"
    if marker not in src:
        return f"# {nonce}-{k}\n{src}"
    line = f"{marker}\nstatic constexpr long kBenchVariant_{k} = {k * 7919 + len(nonce)};  // {nonce}"
    return src.replace(marker, line, 1)


def build_once(src: str, variant: str, root: Path, pch_root: Path | None, jobs: int,
               split_root: Path | None = None) -> dict[str, Any]:
    """One cold build in a child process. ``build_s``: the child's own clock around the build
    (imports excluded); ``wall_s``: the whole process."""
    ext_dir = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=root))
    job = {"src": src, "variant": variant, "ext_dir": str(ext_dir), "pch_root": str(pch_root) if pch_root else None,
           "split_root": str(split_root) if split_root else None}
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir), "MAX_JOBS": str(jobs)}
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "bench.build_speed", "--child", json.dumps(job)],
                          capture_output=True, text=True, env=env, timeout=1800)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the child and every compiler it waited for: far steadier than wall time on a
    # box whose cores other jobs share
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    lines = proc.stdout.strip().splitlines()
    child = json.loads(lines[-1]) if lines else {"ok": False, "error": proc.stderr[-500:]}
    return {"variant": variant, "ok": bool(child.get("ok")), "build_s": child.get("build_s"), "wall_s": wall,
            "cpu_s": cpu,
            "pch_used": child.get("pch_used"), "split_used": child.get("split_used"), "ext_dir": str(ext_dir), **ninja_times(ext_dir),
            **({"error": str(child.get("error"))[-300:]} if not child.get("ok") else {})}


def ninja_times(ext_dir: Path) -> dict[str, float]:
    """Seconds for the compile (main.o) and the link, from ninja's own log."""
    return ninja_seconds(ext_dir, lambda target: "compile_s" if target.endswith(".o") else "link_s")


def child(job: dict[str, Any]) -> None:
    import torch  # noqa: F401 - imported before the clock starts, as in a compile step

    from sandbox import build, protocol

    work = Path(job["ext_dir"]) / "work"
    work.mkdir()
    t = time.perf_counter()
    try:
        if job["variant"] == "sandbox":
            build.install_build_hooks(job["ext_dir"], job["pch_root"], [], None)
        elif job["variant"] == "split":
            build.install_build_hooks(job["ext_dir"], None, [], None, job["split_root"], [])
        protocol.build_candidate(job["src"], work)
    except protocol.StepError as exc:
        print(json.dumps({"ok": False, "error": exc.message}))
        return
    decisions = [json.loads(p.read_text()) for p in Path(job["ext_dir"]).glob("*.pch.json")]
    print(json.dumps({"ok": True, "build_s": time.perf_counter() - t,
                      "pch_used": bool(decisions and decisions[0].get("pch_dir")),
                      "split_used": bool(decisions and decisions[0].get("split_build") not in (None, "fallback"))}))


def time_report(cmd: list[str], source: Path) -> dict[str, float]:
    """g++'s ``-ftime-report`` of one compile: {phase: [user s, wall s]} and the process's wall."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd + ["-ftime-report", "-c", str(source), "-o", str(source.with_suffix(".o"))],
                          capture_output=True, text=True, timeout=1800)
    out: dict[str, Any] = {"process_wall_s": round(time.perf_counter() - t0, 2), "ok": proc.returncode == 0}
    for line in proc.stderr.splitlines():
        name, _, rest = line.partition(":")
        name = name.strip()
        if name in _PHASES:
            nums = re.findall(r"(\d+\.\d+)", rest)
            if len(nums) >= 3:
                out[name] = {"user_s": float(nums[0]), "wall_s": float(nums[2])}
    return out


def breakdown(ext_dir: Path, plain_dir: Path | None) -> dict[str, Any]:
    """Phase times of a sandbox build's main.cpp (and of the plain build's, for the parse), the
    header alone, and the answer without its pybind11 block."""
    ninja = next(ext_dir.rglob("build.ninja"))
    cflags = _cflags(ninja)
    main_cpp = next(ninja.parent.glob("main.cpp"))
    work = Path(tempfile.mkdtemp(prefix="breakdown-", dir=ext_dir))
    source = main_cpp.read_text()
    header_only = work / "header_only.cpp"
    header_only.write_text("#include <torch/extension.h>\n")
    no_binding = work / "no_binding.cpp"
    no_binding.write_text(source.split("PYBIND11_MODULE(")[0])
    full = work / "main.cpp"
    full.write_text(source)
    cxx = os.environ.get("CXX", "c++")
    out: dict[str, Any] = {"cflags": cflags}
    for name, path in (("sandbox_main_cpp", full), ("header_only_with_pch", header_only),
                       ("main_cpp_without_pybind11_block", no_binding)):
        out[name] = time_report([cxx, *cflags], path)
        progress("build_speed", {"breakdown": name, **{k: v["user_s"] for k, v in out[name].items()
                                                          if isinstance(v, dict)}})
    if plain_dir is not None:
        plain_ninja = next(plain_dir.rglob("build.ninja"))
        out["plain_main_cpp"] = time_report([cxx, *_cflags(plain_ninja)], next(plain_ninja.parent.glob("main.cpp")))
    return out


def _cflags(ninja: Path) -> list[str]:
    """The compile flags torch wrote into a build's build.ninja (the PCH's -I among them)."""
    m = re.search(r"^cflags = (.*)$", ninja.read_text(), re.M)
    return m.group(1).split() if m else []


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cpu", choices=["cpu"], help="C++ answers (the CUDA form: bench.cuda_build)")
    p.add_argument("--n", type=int, default=6, help="distinct answers, each built by both variants")
    p.add_argument("--flags", default='["-O3", "-ffast-math", "-march=native", "-fopenmp"]',
                   help="JSON extra_cflags: answers with exactly these (one PCH); 'any' for all answers")
    p.add_argument("--jobs", type=int, default=4, help="ninja jobs per build (MAX_JOBS, the pool's max_jobs)")
    p.add_argument("--pch-root", default=None, help="reuse PCHs here (built if missing); default: a fresh dir")
    p.add_argument("--split-root", default=None, help="reuse the split build's trusted parts here (built if missing)")
    p.add_argument("--breakdown", action="store_true", help="g++ -ftime-report of one sandbox build")
    p.add_argument("--variants", default="plain,sandbox", help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    from sandbox import build, split_build

    variants = tuple(v for v in VARIANTS if v in args.variants.split(","))
    if "plain" not in variants or len(variants) < 2:
        raise SystemExit(f"--variants {args.variants!r}: plain and at least one of {', '.join(VARIANTS[1:])}")
    flags = None if args.flags == "any" else json.loads(args.flags)
    pool = templates(flags)
    if not pool:
        raise SystemExit(f"no corpus answer builds with extra_cflags {flags}")
    root = Path(tempfile.mkdtemp(prefix="bench_build_speed_"))
    pch_root = Path(args.pch_root) if args.pch_root else root / "pch"
    split_root = Path(args.split_root) if args.split_root else root / "split"
    pch_s: dict[str, float] = {}
    split_s: dict[str, dict[str, float]] = {}
    for cflags in {json.dumps(c) for _, _, c in pool}:
        if "sandbox" in variants:
            t0 = time.perf_counter()
            build.build_pch(pch_root, json.loads(cflags))  # trusted, once per flag set (the pool's job)
            pch_s[cflags] = round(time.perf_counter() - t0, 1)
            print(f"[bench.build_speed] PCH for {cflags}: {pch_s[cflags]} s", flush=True)
        if "split" in variants:  # trusted: the library once, the min tier's PCH per flag set
            split_s[cflags] = split_build.build_trusted(split_root, json.loads(cflags))
            print(f"[bench.build_speed] split build's trusted parts for {cflags}: {split_s[cflags]}", flush=True)
    nonce = f"bench-{int(time.time())}"
    runs: list[dict[str, Any]] = []
    for k in range(args.n):
        task, src, _ = pool[k % len(pool)]
        answer = distinct(src, k, nonce)
        order = variants[k % len(variants):] + variants[:k % len(variants)]  # each variant first in turn
        for variant in order:
            r = {"answer": k, "task": task, **build_once(answer, variant, root, pch_root, args.jobs, split_root)}
            runs.append(r)
            progress("build_speed", {k2: v for k2, v in r.items() if k2 not in ("ext_dir", "error")})
    rows = []
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant and r["ok"]]
        row: dict[str, Any] = {"variant": variant, "builds": len(mine),
                               "failed": sum(1 for r in runs if r["variant"] == variant and not r["ok"])}
        for key in ("build_s", "cpu_s", "compile_s", "link_s"):
            vals = [r[key] for r in mine if r.get(key) is not None]
            for q in (50, 10, 90):
                row[f"{key[:-2]} p{q} s"] = percentile(vals, q)
        rows.append(row)
    extra: dict[str, Any] = {"target_ratio": 0.3, "pch_build_s": pch_s, "split_trusted_s": split_s, "jobs": args.jobs,
                             "pch_used": all(r["pch_used"] for r in runs if r["variant"] == "sandbox" and r["ok"]),
                             "split_used": all(r["split_used"] for r in runs if r["variant"] == "split" and r["ok"]),
                             "load_avg": os.getloadavg(), "runs": runs}
    for variant in variants[1:]:  # variant / plain, the same answer ("ratio_*": the sandbox's, as before)
        pairs = [(p, s) for p in runs for s in runs if p["variant"] == "plain" and s["variant"] == variant
                 and p["answer"] == s["answer"] and p["ok"] and s["ok"]]
        ratios = [s["build_s"] / p["build_s"] for p, s in pairs]
        prefix = "ratio" if variant == "sandbox" else f"{variant}_ratio"
        extra.update({f"{prefix}_p50": percentile(ratios, 50), f"{prefix}_min": min(ratios, default=float("nan")),
                      f"{prefix}_max": max(ratios, default=float("nan")),
                      f"{'cpu_ratio' if variant == 'sandbox' else variant + '_cpu_ratio'}_p50":
                          percentile([s["cpu_s"] / p["cpu_s"] for p, s in pairs], 50)})
    if args.breakdown:
        last = next((r for r in reversed(runs) if r["variant"] == "sandbox" and r["ok"]), None)
        plain = next((r for r in reversed(runs) if r["variant"] == "plain" and r["ok"]), None)
        if last:
            extra["breakdown"] = breakdown(Path(last["ext_dir"]), Path(plain["ext_dir"]) if plain else None)
    report("build_speed", args, rows, extra)


if __name__ == "__main__":
    main()
