"""Self-check of the sandbox on a real device: ``python -m sandbox.selfcheck --backend cuda --out DIR``.

Runs a built-in set of correct, wrong and adversarial answers through :class:`SandboxPool`, prints a
table (expected vs got) and writes ``DIR/selfcheck.json``. Exit code 1 when any row differs from
what it should be. ``--backend cpu`` runs the CPU set (what CI covers in tests/sandbox).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox.config import load_default_config
from sandbox.pool import SandboxPool

ADD_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]


def get_init_inputs():
    return []
'''

_CUDA_ADD = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
__global__ void add_kernel(const float* a, const float* b, float* o, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < LIMIT) o[i] = a[i] + b[i];
    BODY
}
torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto o = torch::empty_like(a);
    long n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), o.data_ptr<float>(), n);
    return o;
}
"""
ext = load_inline("NAME", cpp_sources="torch::Tensor add(torch::Tensor a, torch::Tensor b);",
                  cuda_sources=cuda_src, functions=["add"])


class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.add(a.contiguous(), b.contiguous())
'''


def cuda_add(name: str, limit: str = "n", body: str = "") -> str:
    return _CUDA_ADD.replace("NAME", name).replace("LIMIT", limit).replace("BODY", body)


PY_HEADER = "import os, sys, time\nimport torch\nimport torch.nn as nn\n"


def py_forward(code: str) -> str:
    lines = "\n".join("        " + line for line in code.splitlines())
    return PY_HEADER + "class ModelNew(nn.Module):\n    def forward(self, a, b):\n" + lines + "\n"


TRITON_ADD = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _add(a_ptr, b_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, tl.load(a_ptr + offs, mask=m) + tl.load(b_ptr + offs, mask=m), mask=m)


class ModelNew(nn.Module):
    def forward(self, a, b):
        o = torch.empty_like(a)
        n = a.numel()
        _add[(triton.cdiv(n, 1024),)](a, b, o, n, BLOCK=1024)
        return o
'''

CPP_ADD = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous(), bc = b.contiguous();
    auto o = torch::empty_like(ac);
    const float *pa = ac.data_ptr<float>(), *pb = bc.data_ptr<float>();
    float* po = o.data_ptr<float>();
    #pragma omp parallel for
    for (long i = 0; i < ac.numel(); ++i) po[i] = pa[i] + pb[i];
    return o;
}
"""
ext = load_inline("selfcheck_cpp_add", cpp_sources=src, functions=["add"],
                  extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.add(a, b)
'''

SMALL_ADD_TASK = ADD_TASK.replace("4096, 4096", "256, 1024")


@dataclass
class Case:
    name: str
    backend: str
    task: str
    answer: str
    expect: str | None          # expected error_kind (None: correct)
    must_be_timed: bool = False


def cuda_cases() -> list[Case]:
    return [
        Case("cuda_add_correct", "cuda", ADD_TASK, cuda_add("sc_add_ok"), None, True),
        Case("cuda_add_off_by_one", "cuda", ADD_TASK, cuda_add("sc_add_obo", limit="n - 1"), "wrong_output"),
        Case("cuda_illegal_memory_access", "cuda", ADD_TASK,
             cuda_add("sc_add_ima", body="if (i == 0) { o[i + (1L << 40)] = 1.0f; }"), "runtime_error"),
        Case("cuda_correct_after_fault", "cuda", ADD_TASK, cuda_add("sc_add_ok"), None, True),
        Case("cuda_compile_error", "cuda", ADD_TASK, cuda_add("sc_add_err", body="undeclared_symbol = 1;"),
             "compile_error"),
        Case("cuda_kernel_never_ends", "cuda", ADD_TASK,
             cuda_add("sc_add_hang", body="if (i == 0) { while (true) { __nanosleep(1000); } }"), "timeout"),
        Case("cuda_returns_uninitialised", "cuda", ADD_TASK, py_forward("return torch.empty_like(a)"),
             "wrong_output"),
        Case("cuda_side_stream_work_is_waited_for", "cuda", ADD_TASK, py_forward(
            "s = torch.cuda.Stream()\nwith torch.cuda.stream(s):\n    o = a + b\nreturn o"), None, True),
        Case("cuda_fake_event_timing", "cuda", ADD_TASK, PY_HEADER +
             "class _E:\n    def __init__(self, *a, **k): pass\n    def record(self, *a): pass\n"
             "    def synchronize(self): pass\n    def elapsed_time(self, other): return 1e-6\n"
             "torch.cuda.Event = _E\n"
             "class ModelNew(nn.Module):\n    def forward(self, a, b):\n"
             "        for _ in range(20):\n            o = a + b\n        return o\n", None, True),
        Case("cuda_gpu_memory_hog", "cuda", ADD_TASK, py_forward("h = torch.empty(2**40, device=a.device)\nreturn a + b"),
             "memory_limit"),
        Case("cuda_segfault", "cuda", ADD_TASK, py_forward("import ctypes\nctypes.string_at(0)\nreturn a + b"),
             "runtime_error"),
        Case("triton_gpu_add_correct", "triton", ADD_TASK, TRITON_ADD, None, True),
        Case("torch_python_correct", "cuda", ADD_TASK, py_forward("return torch.add(a, b)"), None, True),
    ]


def cpu_cases() -> list[Case]:
    return [
        Case("cpu_cpp_add_correct", "cpu", SMALL_ADD_TASK, CPP_ADD, None, True),
        Case("cpu_python_constant", "cpu", SMALL_ADD_TASK, py_forward("return torch.zeros_like(a)"), "wrong_output"),
        Case("cpu_python_segfault", "cpu", SMALL_ADD_TASK, py_forward("import ctypes\nctypes.string_at(0)\nreturn a"),
             "runtime_error"),
        Case("triton_interpreter_add", "triton", SMALL_ADD_TASK, TRITON_ADD, None),
    ]


async def run_cases(cases: list[Case], cfg_overrides: dict) -> list[dict]:
    """Every case at once: the pool overlaps the builds (``compile_workers``) and gives each GPU to
    one run step at a time, so timings are not disturbed; a row is printed as soon as it is done."""
    cfg = load_default_config(**cfg_overrides)

    async def one(pool: SandboxPool, case: Case) -> dict:
        t = time.monotonic()
        res = await pool.evaluate(case.task, case.answer, case.backend, key=case.name)
        ok = res.error_kind == case.expect and (res.correct == (case.expect is None))
        if case.must_be_timed:
            ok = ok and res.timed and (res.speedup or 0) > 0
        if case.name == "cuda_fake_event_timing":
            # 20 adds must not time as faster than one: the harness's clock was used
            ok = ok and res.speedup is not None and res.speedup < 2.0
        row = {"case": case.name, "expect": case.expect or "correct",
               "got": res.error_kind or ("correct" if res.correct else "?"), "ok": ok,
               "speedup": res.speedup, "ref_ms": res.ref_runtime_ms, "new_ms": res.new_runtime_ms,
               "wall_s": round(time.monotonic() - t, 2), "error": (res.error or "")[:300],
               "isolation": res.isolation, "device": res.device, "wall": res.wall_s}
        print(f"[selfcheck] {case.name}: {row['got']} ({'ok' if ok else 'NOT AS EXPECTED'}, "
              f"{row['wall_s']} s)", flush=True)
        return row

    async with SandboxPool(cfg) as pool:
        rows = list(await asyncio.gather(*[one(pool, case) for case in cases]))
        verdict = pool.probe_verdict  # the GPU isolation probe's choice, when it ran
        rows.append({"case": "_stats", "stats": pool.stats(),
                     "isolation_probe": dataclasses.asdict(verdict) if verdict else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandbox.selfcheck", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", required=True, help="directory for selfcheck.json")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a sandbox config value (YAML syntax), e.g. restrict_writes=false")
    a = ap.parse_args(argv)
    cases = cuda_cases() if a.backend == "cuda" else cpu_cases()
    if a.only:
        keep = set(a.only.split(","))
        cases = [c for c in cases if c.name in keep]
    overrides = {"run_timeout_s": 60, "timing_runs": 20, "cache_dir": a.cache_dir}
    for item in a.set:
        import yaml

        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    rows = asyncio.run(run_cases(cases, overrides))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "selfcheck.json").write_text(json.dumps(rows, indent=2))
    print(f"{'case':40s} {'expect':15s} {'got':15s} {'ok':4s} {'speedup':>8s} {'wall s':>7s}")
    for r in rows:
        if r["case"] == "_stats":
            continue
        sp = "-" if r["speedup"] is None else f"{r['speedup']:.3f}"
        print(f"{r['case']:40s} {r['expect']:15s} {r['got']:15s} {'yes' if r['ok'] else 'NO':4s} {sp:>8s} "
              f"{r['wall_s']:7.1f}")
    print("stats:", json.dumps(rows[-1]["stats"]))
    if rows[-1]["isolation_probe"]:
        print("GPU isolation probe:", json.dumps(rows[-1]["isolation_probe"]))
    return 0 if all(r["ok"] for r in rows if r["case"] != "_stats") else 1


if __name__ == "__main__":
    sys.exit(main())
