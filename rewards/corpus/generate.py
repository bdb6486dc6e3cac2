"""A generated SFT corpus for the real-model recipe: correct, varied kernels for many
ops x shapes, none of them a held-out task.

Each item is a synthetic KernelBench-style task (``Model`` + ``get_inputs``, with ``CPU_SIZES``)
and a correct answer to it (``ModelNew`` with a CUDA or C++ extension). Answers vary in the kernel's
form (a grid-stride scalar loop, float4 loads, block size; on cpu a plain or an OpenMP loop) and
share one scalar expression per op (:data:`UNARY`, :data:`BINARY`), which
``tests/rewards/test_corpus_generate.py`` checks against the torch reference in one C++ build.

Held-out tasks stay out: :func:`generate` drops every op that names a held-out task (``20_tanh`` ->
``tanh``) or whose reference computes what a held-out task's does, and every shape of a held-out task
(``(BATCH, DIM)`` of its sizes), whatever the op. The held-out set is the project's own split
(``rewards.tasks.loader.split`` with ``reward.holdout_frac``/``reward.split_seed``) of the task set
the RL run uses: the built-in tasks here, a KernelBench checkout on the GPU (``--tasks <path>``).

    python -m rewards.corpus.generate --out ~/kernel_corpus --backend cuda [--tasks <KernelBench>]

writes ``<out>/level1/<N>_gen_<op>_<B>x<D>.py`` (the synthetic tasks) and ``<out>/sft.jsonl``
(``{"task", "response"}`` rows, ``pipeline.sft``'s ``sft.data``): run the warm start with
``reward.tasks=<out> reward.holdout_frac=0 sft.data=<out>/sft.jsonl``.
"""
from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# op -> (torch expression of x for Model.forward, C expression of float v for the kernel)
UNARY: dict[str, tuple[str, str]] = {
    "relu": ("torch.relu(x)", "fmaxf(v, 0.f)"),
    "relu6": ("torch.clamp(x, 0.0, 6.0)", "fminf(fmaxf(v, 0.f), 6.f)"),
    "leaky_relu": ("torch.nn.functional.leaky_relu(x, 0.01)", "(v > 0.f ? v : 0.01f * v)"),
    "elu": ("torch.nn.functional.elu(x)", "(v > 0.f ? v : expm1f(v))"),
    "selu": ("torch.selu(x)",
             "1.0507009873554805f * (v > 0.f ? v : 1.6732632423543772f * expm1f(v))"),
    "gelu": ("torch.nn.functional.gelu(x)", "0.5f * v * (1.f + erff(v * 0.70710678118654752f))"),
    "gelu_tanh": ("torch.nn.functional.gelu(x, approximate='tanh')",
                  "0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))"),
    "silu": ("torch.nn.functional.silu(x)", "v / (1.f + expf(-v))"),
    "mish": ("torch.nn.functional.mish(x)", "v * tanhf(log1pf(expf(fminf(v, 20.f))) + (v > 20.f ? v - 20.f : 0.f))"),
    "sigmoid": ("torch.sigmoid(x)", "1.f / (1.f + expf(-v))"),
    "hardsigmoid": ("torch.nn.functional.hardsigmoid(x)", "fminf(fmaxf(v / 6.f + 0.5f, 0.f), 1.f)"),
    "hardswish": ("torch.nn.functional.hardswish(x)", "v * fminf(fmaxf(v + 3.f, 0.f), 6.f) / 6.f"),
    "hardtanh": ("torch.nn.functional.hardtanh(x)", "fminf(fmaxf(v, -1.f), 1.f)"),
    "softsign": ("torch.nn.functional.softsign(x)", "v / (1.f + fabsf(v))"),
    "softplus": ("torch.nn.functional.softplus(x)", "(v > 20.f ? v : log1pf(expf(v)))"),
    "tanh": ("torch.tanh(x)", "tanhf(v)"),
    "abs": ("torch.abs(x)", "fabsf(v)"),
    "square": ("x * x", "v * v"),
    "exp": ("torch.exp(x)", "expf(v)"),
    "log1p_abs": ("torch.log1p(torch.abs(x))", "log1pf(fabsf(v))"),
    "sin": ("torch.sin(x)", "sinf(v)"),
    "cos": ("torch.cos(x)", "cosf(v)"),
    "scale_shift": ("x * 1.5 + 0.25", "v * 1.5f + 0.25f"),
    "clamp_half": ("torch.clamp(x, -0.5, 0.5)", "fminf(fmaxf(v, -0.5f), 0.5f)"),
    "neg_exp_abs": ("torch.exp(-torch.abs(x))", "expf(-fabsf(v))"),
}
# op -> (torch expression of a, b; C expression of floats a, b)
BINARY: dict[str, tuple[str, str]] = {
    "add": ("a + b", "a + b"),
    "sub": ("a - b", "a - b"),
    "mul": ("a * b", "a * b"),
    "maximum": ("torch.maximum(a, b)", "fmaxf(a, b)"),
    "minimum": ("torch.minimum(a, b)", "fminf(a, b)"),
    "add_relu": ("torch.relu(a + b)", "fmaxf(a + b, 0.f)"),
    "mul_sigmoid": ("a * torch.sigmoid(b)", "a / (1.f + expf(-b))"),
    "swiglu": ("torch.nn.functional.silu(a) * b", "a / (1.f + expf(-a)) * b"),
    "squared_diff": ("(a - b) * (a - b)", "(a - b) * (a - b)"),
    "lerp_half": ("a + 0.5 * (b - a)", "a + 0.5f * (b - a)"),
}
# (BATCH, DIM) at full size; CPU sizes are small versions
SHAPES: list[tuple[int, int]] = [(4096, 4096), (8192, 2048), (2048, 8192), (16384, 1024), (1024, 16384),
                                 (8192, 8192), (512, 32768), (32768, 512), (4096, 2000), (3000, 3000)]
CPU_SHAPE = {(b, d): (max(8, b // 128), max(16, d // 64)) for b, d in SHAPES}
BLOCKS = (128, 256, 512)


@dataclass(frozen=True)
class GeneratedItem:
    task_id: str        # "L1/<n>_gen_<op>_<B>x<D>" in the generated task tree
    op: str
    shape: tuple[int, int]
    reference: str      # the task file (Model, get_inputs, CPU_SIZES)
    answer: str         # the answer's code block (ModelNew + extension)
    style: str          # which kernel form the answer takes

    def response(self) -> str:
        return f"{self.op} over a {self.shape[0]}x{self.shape[1]} tensor: {self.style}.\n\n```python\n{self.answer}\n```"


def _words(s: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", s.lower()) if w}


def held_out_ops(task_ids: Iterable[str]) -> set[str]:
    """Op names a held-out task id names: its stem without the number (``L1/20_tanh`` -> ``tanh``),
    and every word of it longer than two letters (``L2/14_bias_gelu_residual`` -> bias, gelu, ...)."""
    out: set[str] = set()
    for tid in task_ids:
        stem = tid.partition("/")[2].split("_", 1)[-1].lower()
        out.add(stem)
        out.update(w for w in _words(stem) if len(w) > 2)
    return out


def _forward_exprs(source: str) -> set[str]:
    """The normalised return expressions of a task file's ``Model.forward``."""
    m = re.search(r"class Model\b.*?def forward\(self[^)]*\):(.*?)(?:\n\S|\ndef |\Z)", source, re.S)
    body = m.group(1) if m else ""
    return {re.sub(r"\s+", "", e) for e in re.findall(r"return\s+(.+)", body)}


def _sizes(source: str) -> set[tuple[int, int]]:
    vals = {k: int(v) for k, v in re.findall(r"^([A-Z_]+)\s*=\s*(\d+)\s*$", source, re.M)}
    b, d = vals.get("BATCH", vals.get("N")), vals.get("DIM", vals.get("M"))
    return {(b, d)} if b and d else set()


def _reference(op: str, shape: tuple[int, int]) -> str:
    b, d = shape
    cb, cd = CPU_SHAPE.get(shape, (max(8, b // 128), max(16, d // 64)))
    if op in UNARY:
        args, expr, inputs = "x", UNARY[op][0], "[torch.randn(BATCH, DIM)]"
    else:
        args, expr, inputs = "a, b", BINARY[op][0], "[torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)]"
    return (f'"""Generated task: {op} over a (BATCH, DIM) float32 tensor."""\nimport torch\nimport torch.nn as nn\n\n'
            f"BATCH = {b}\nDIM = {d}\n# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').\n"
            f'CPU_SIZES = {{"BATCH": {cb}, "DIM": {cd}}}\n\n\nclass Model(nn.Module):\n    def __init__(self):\n'
            f"        super().__init__()\n\n    def forward(self, {args}):\n        return {expr}\n\n\n"
            f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n")


def _cuda_answer(op: str, name: str, block: int, vec4: bool) -> tuple[str, str]:
    unary = op in UNARY
    c = UNARY[op][1] if unary else BINARY[op][1]
    params = "const float* __restrict__ x" if unary else "const float* __restrict__ pa, const float* __restrict__ pb"
    load = "float v = x[j];" if unary else "float a = pa[j]; float b = pb[j];"
    targs = "torch::Tensor x" if unary else "torch::Tensor a, torch::Tensor b"
    ptrs = "x.data_ptr<float>()" if unary else "a.data_ptr<float>(), b.data_ptr<float>()"
    first = "x" if unary else "a"
    check = (f'TORCH_CHECK({first}.is_cuda() && {first}.is_contiguous() && {first}.scalar_type() == torch::kFloat, '
             f'"{first} must be a contiguous float32 CUDA tensor");')
    if not unary:
        check += '\n    TORCH_CHECK(b.is_cuda() && b.is_contiguous() && b.sizes() == a.sizes(), "b must match a");'
    if vec4:
        fields = "xyzw"
        if unary:
            body4 = "float4 in = reinterpret_cast<const float4*>(x)[j];\n        float4 r;\n" + "".join(
                f"        {{ float v = in.{f}; r.{f} = {c}; }}\n" for f in fields)
        else:
            body4 = ("float4 ia = reinterpret_cast<const float4*>(pa)[j];\n"
                     "        float4 ib = reinterpret_cast<const float4*>(pb)[j];\n        float4 r;\n" + "".join(
                         f"        {{ float a = ia.{f}; float b = ib.{f}; r.{f} = {c}; }}\n" for f in fields))
        loop = (f"    const int64_t n4 = n / 4;\n    for (int64_t j = i; j < n4; j += stride) {{\n        {body4}"
                f"        reinterpret_cast<float4*>(out)[j] = r;\n    }}\n"
                f"    for (int64_t j = n4 * 4 + i; j < n; j += stride) {{ {load} out[j] = {c}; }}\n")
        blocks = f"(int)std::min<int64_t>((n / 4 + {block} - 1) / {block} + 1, 65535)"
        style = f"float4 loads, grid-stride loop, {block} threads a block"
    else:
        loop = f"    for (int64_t j = i; j < n; j += stride) {{ {load} out[j] = {c}; }}\n"
        blocks = f"(int)std::min<int64_t>((n + {block} - 1) / {block}, 65535)"
        style = f"grid-stride scalar loop, {block} threads a block"
    src = (f'"""{op}: {style}."""\nimport torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n'
           f'CUDA_SRC = r"""\n#include <torch/extension.h>\n#include <c10/cuda/CUDAStream.h>\n\n'
           f"__global__ void {name}_kernel({params}, float* __restrict__ out, int64_t n) {{\n"
           f"    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n"
           f"    const int64_t stride = (int64_t)gridDim.x * blockDim.x;\n{loop}}}\n\n"
           f"torch::Tensor {name}_forward({targs}) {{\n    {check}\n    auto out = torch::empty_like({first});\n"
           f"    const int64_t n = {first}.numel();\n    const int blocks = {blocks};\n"
           f"    {name}_kernel<<<blocks, {block}, 0, c10::cuda::getCurrentCUDAStream()>>>({ptrs}, out.data_ptr<float>(), n);\n"
           f'    return out;\n}}\n"""\n\nCPP_SRC = "torch::Tensor {name}_forward({targs});"\n\n'
           f'_ext = load_inline(name="{name}", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC, functions=["{name}_forward"],\n'
           f'                   extra_cuda_cflags=["-O3"])\n\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n'
           f"        super().__init__()\n\n    def forward(self, {'x' if unary else 'a, b'}):\n"
           f"        return _ext.{name}_forward({'x.contiguous()' if unary else 'a.contiguous(), b.contiguous()'})")
    return src, style


def _cpu_answer(op: str, name: str, omp: bool) -> tuple[str, str]:
    unary = op in UNARY
    c = UNARY[op][1] if unary else BINARY[op][1]
    targs = "torch::Tensor x" if unary else "torch::Tensor a, torch::Tensor b"
    first = "x" if unary else "a"
    ptrs = ("    const float* px = x.data_ptr<float>();\n" if unary else
            "    const float* pa = a.data_ptr<float>();\n    const float* pb = b.data_ptr<float>();\n")
    load = "float v = px[j];" if unary else "float a = pa[j]; float b = pb[j];"
    pragma = "    #pragma omp parallel for simd schedule(static)\n" if omp else ""
    style = "an OpenMP parallel loop" if omp else "a plain loop"
    flags = '["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"]' if omp else '["-O3"]'
    src = (f'"""{op}: {style}."""\nimport torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n'
           f'CPP_SRC = r"""\n#include <torch/extension.h>\n#include <cmath>\n\n'
           f"torch::Tensor {name}_forward({targs}) {{\n"
           f'    TORCH_CHECK({first}.is_contiguous() && {first}.scalar_type() == torch::kFloat, "float32 contiguous input");\n'
           f"    auto out = torch::empty_like({first});\n    const int64_t n = {first}.numel();\n{ptrs}"
           f"    float* po = out.data_ptr<float>();\n{pragma}    for (int64_t j = 0; j < n; ++j) {{ {load} po[j] = {c}; }}\n"
           f'    return out;\n}}\n"""\n\n'
           f'_ext = load_inline(name="{name}", cpp_sources=CPP_SRC, functions=["{name}_forward"],\n'
           f"                   extra_cflags={flags})\n\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
           f"        super().__init__()\n\n    def forward(self, {'x' if unary else 'a, b'}):\n"
           f"        return _ext.{name}_forward({'x.contiguous()' if unary else 'a.contiguous(), b.contiguous()'})")
    return src, style


def generate(held_out: Sequence[tuple[str, str]] = (), backend: str = "cuda",
             ops: Iterable[str] | None = None, shapes: Sequence[tuple[int, int]] = SHAPES,
             start_id: int = 1000) -> list[GeneratedItem]:
    """Items for every allowed op x shape. ``held_out``: ``(task_id, source)`` of the held-out
    tasks; an op they name or compute, and a shape they use, is left out."""
    if backend not in ("cuda", "cpu"):
        raise ValueError(f"backend {backend!r}: the generator writes cuda or cpu answers")
    names = held_out_ops(t for t, _ in held_out)
    exprs: set[str] = set()
    held_shapes: set[tuple[int, int]] = set()
    for _, src in held_out:
        exprs |= _forward_exprs(src)
        held_shapes |= _sizes(src)
    items: list[GeneratedItem] = []
    n = start_id
    for op in (list(ops) if ops is not None else [*UNARY, *BINARY]):
        torch_expr = (UNARY.get(op) or BINARY[op])[0]
        if op in names or _words(op) & names or re.sub(r"\s+", "", torch_expr) in exprs:
            continue
        for k, shape in enumerate(shapes):
            if shape in held_shapes:
                continue
            name = f"gen_{op}_{shape[0]}x{shape[1]}"
            if backend == "cuda":
                answer, style = _cuda_answer(op, name, BLOCKS[k % len(BLOCKS)], vec4=k % 2 == 0)
            else:
                answer, style = _cpu_answer(op, name, omp=k % 2 == 0)
            items.append(GeneratedItem(f"L1/{n}_{name}", op, shape, _reference(op, shape), answer, style))
            n += 1
    return items


def project_holdout(tasks: str = "builtin", holdout_frac: float = 0.2, split_seed: int = 0,
                    levels: Sequence[int] = (1, 2)) -> list[tuple[str, str]]:
    """``(task_id, source)`` of the held-out tasks of the project's split of ``tasks``."""
    from rewards.tasks.loader import load_builtin, load_kernelbench, split

    loaded = (load_builtin(levels=levels) if tasks == "builtin"
              else load_kernelbench(Path(tasks), levels=levels, skip_invalid=True))
    _, held = split(loaded, holdout_frac, split_seed)
    return [(t.id, Path(t.path).read_text()) for t in held]


def write(items: Sequence[GeneratedItem], out: str | Path) -> Path:
    """The task tree (``level1/<n>_<name>.py``) and ``sft.jsonl``; returns the JSONL's path."""
    out = Path(out).expanduser()
    (out / "level1").mkdir(parents=True, exist_ok=True)
    (out / "level2").mkdir(parents=True, exist_ok=True)  # the loader's default levels are 1 and 2
    with (out / "sft.jsonl").open("w") as f:
        for it in items:
            (out / "level1" / f"{it.task_id.partition('/')[2]}.py").write_text(it.reference)
            f.write(json.dumps({"task": it.task_id, "response": it.response()}) + "\n")
    return out / "sft.jsonl"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tasks", default="builtin", help="the RL run's task set: builtin or a KernelBench path")
    ap.add_argument("--holdout-frac", type=float, default=0.2)
    ap.add_argument("--split-seed", type=int, default=0)
    a = ap.parse_args(argv)
    held = project_holdout(a.tasks, a.holdout_frac, a.split_seed)
    items = generate(held, a.backend)
    path = write(items, a.out)
    print(f"{len(items)} answers ({len({i.op for i in items})} ops) -> {path}; held out: {len(held)} tasks")


if __name__ == "__main__":
    main()
