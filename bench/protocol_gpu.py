"""The evaluation protocol at KernelBench's published sizes on one GPU: ``python -m bench.protocol_gpu``.

A ReLU task of KernelBench level 1's published size (4096 x 393216 float32: 6 GiB in, 6 GiB out),
written here, evaluated through SandboxPool with honest answers (the reference itself, a torch op, a
CUDA kernel) and hostile ones (an output cache keyed on a few input values, a constant-after-first
answer, in-place modification, returning the input, a never-ending kernel), each twice where noise
matters; then the honest CUDA answer again, which must still score. Prints one JSON line per
evaluation and writes ``--out``. CUDA only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from bench.common import baseline_path
from sandbox.config import load_default_config
from sandbox.pool import SandboxPool

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 4096
dim = 393216


def get_inputs():
    return [torch.rand(batch_size, dim) * 2 - 1]


def get_init_inputs():
    return []
'''

PY = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n{body}\n"

CUDA_RELU = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
__global__ void relu_kernel(const float4* __restrict__ x, float4* __restrict__ o, long n4) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    for (; i < n4; i += stride) {
        float4 v = x[i];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        o[i] = v;
    }
}
torch::Tensor relu(torch::Tensor x) {
    auto o = torch::empty_like(x);
    long n4 = x.numel() / 4;
    relu_kernel<<<132 * 16, 512>>>((const float4*)x.data_ptr<float>(), (float4*)o.data_ptr<float>(), n4);
    return o;
}
"""
ext = load_inline("bench_relu_f4", cpp_sources="torch::Tensor relu(torch::Tensor x);", cuda_sources=src,
                  functions=["relu"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x.contiguous())
'''

CASES = {
    "reference_as_candidate": (TASK + "\n\nclass ModelNew(Model):\n    pass\n", "correct"),
    "torch_clamp": (PY.format(body="        return x.clamp_min(0.0)"), "correct"),
    "cuda_relu": (CUDA_RELU, "correct"),
    "output_cache_on_a_few_values": (PY.format(body=(
        "        k = tuple(x.flatten()[:4].tolist())\n"
        "        if k not in _c:\n            _c[k] = torch.relu(x)\n        return _c[k]")).replace(
        "class ModelNew", "_c = {}\n\n\nclass ModelNew"), "rule_violation"),
    "work_only_in_first_call": (PY.format(body=(
        "        if not hasattr(self, 'o'):\n            self.o = torch.relu(x)\n        return self.o")), "wrong_output"),
    "in_place_returns_input": (PY.format(body="        return x.clamp_min_(0.0)"), "rule_violation"),
    "returns_a_view_of_the_input": (PY.format(body="        return x.view(-1).view(x.shape)"), None),
    "cuda_relu_again": (CUDA_RELU, "correct"),
}


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="default: bench/baselines/<device>/protocol_gpu.json")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args(argv)
    cfg = load_default_config(backend="cuda", cache_dir=a.cache_dir, max_concurrent=4, compile_workers=4)
    rows = []
    async with SandboxPool(cfg) as pool:
        for name, (src, expect) in CASES.items():
            if a.only and name not in a.only:
                continue
            t = time.monotonic()
            r = await pool.evaluate(TASK, src, "cuda", key=name)
            got = "correct" if r.correct else r.error_kind
            row = {"name": name, "expected": expect, "got": got, "ok": expect is None or got == expect,
                   "speedup": r.speedup, "new_ms": r.new_runtime_ms, "ref_ms": r.ref_runtime_ms,
                   "spread": r.new_runtime_spread, "ref_spread": r.ref_runtime_spread, "flags": r.flags,
                   "error": (r.error or "")[:300], "wall_s": r.wall_s, "seconds": round(time.monotonic() - t, 2),
                   "isolation": r.isolation, "log_tail": r.log_tail[-600:]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        stats = pool.stats()
    out = Path(a.out or baseline_path("protocol_gpu"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "stats": stats}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
