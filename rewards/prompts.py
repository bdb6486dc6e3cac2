"""Chat messages for each turn, and rendering them through a tokenizer's chat template.

Turn 1: system (role, backend, rules, answer format, and for the cuda and triton backends a worked
example unless ``reward.worked_example`` is false) + user (the task source). Turn t > 1: the
same two messages, then for every finished turn the model's summary and kernel as an assistant
message and the feedback as a user message that asks for an improvement. Earlier reasoning
(``<think>``) never comes back. Later turns extend earlier prompts, so prefix caching applies.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rewards.interface import Turn
from rewards.parse import strip_thinking
from rewards.rules import RULES

BACKEND_INSTRUCTIONS = {
    "cuda": ("Write custom CUDA kernels (`__global__` functions) and compile them with "
             "`torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=..., functions=[...])` "
             "at module import. Launch them on the current stream (`at::cuda::getCurrentCUDAStream()`)."),
    "triton": ("Write Triton kernels (`@triton.jit` functions using `triton.language as tl`) and launch them "
               "from ModelNew.forward with `kernel[grid](...)`."),
    "cpu": ("Write C++ kernels (OpenMP and SIMD are welcome) and compile them with "
            "`torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., functions=[...], "
            "extra_cflags=['-O3', '-fopenmp'], extra_ldflags=['-fopenmp'])` at module import. "
            "Work on raw `data_ptr<float>()` buffers; tensors are contiguous float32 on the CPU."),
}

BACKEND_LABELS = {"cuda": "CUDA", "triton": "Triton", "cpu": "C++ (CPU)"}

ANSWER_FORMAT = ("Answer format: first a brief summary (a few sentences) of your approach, then exactly one "
                 "fenced ```python code block containing the complete module: imports, kernels and "
                 "`class ModelNew(nn.Module)`.")


# A worked example in KernelBench's style (our own text and kernel): a reference Model and the
# ModelNew that replaces it, so a model that has never seen this answer format sees one. Only the
# GPU backends have one; the cpu backend's prompt (the laptop's tiny model) stays as it was.
_EXAMPLE_MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")]


def get_init_inputs():
    return []'''

_EXAMPLE_CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

add_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                           float* __restrict__ out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i];
    }
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    add_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

add_cpp = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"

add_ext = load_inline(
    name="example_add",
    cpp_sources=add_cpp,
    cuda_sources=add_source,
    functions=["add_cuda"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return add_ext.add_cuda(a.contiguous(), b.contiguous())'''

_EXAMPLE_TRITON = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(a_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, a + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        a = a.contiguous()
        b = b.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
        return out'''

WORKED_EXAMPLES = {"cuda": _EXAMPLE_CUDA, "triton": _EXAMPLE_TRITON}


def worked_example(backend: str) -> str:
    """The example block of the system prompt for ``backend`` ("" where it has none)."""
    answer = WORKED_EXAMPLES.get(backend)
    if answer is None:
        return ""
    label = BACKEND_LABELS[backend]
    return (f"\n\nAn example of the format. Given this reference architecture:\n\n```python\n{_EXAMPLE_MODEL}\n```\n\n"
            f"an answer replaces the elementwise addition with a {label} kernel of its own:\n\n"
            "Summary: one elementwise kernel, one thread per element, launched on the current stream.\n\n"
            f"```python\n{answer}\n```\n\n"
            "Your task will be a different architecture; write kernels for the operators it computes "
            "(fusing them where you can) in the same format.")


def system_prompt(backend: str, enabled_rules: Sequence[str], example: bool = False) -> str:
    """``example``: append :func:`worked_example` (the cuda and triton backends have one)."""
    if backend not in BACKEND_INSTRUCTIONS:
        raise ValueError(f"backend={backend!r}: expected one of {tuple(BACKEND_INSTRUCTIONS)}")
    rules = "\n".join(f"- {RULES[name].description}" for name in enabled_rules if name in RULES)
    return (
        "You are an expert in high-performance GPU and CPU kernels. You are given a PyTorch reference "
        "module `Model` and write `ModelNew`, a drop-in replacement that computes the same outputs "
        "(same constructor arguments, same forward inputs, outputs within 1e-4 for float32) and runs "
        "faster, with the work done in your own kernels.\n"
        f"{BACKEND_INSTRUCTIONS[backend]}\n"
        "Rules (an answer that breaks one scores 0):\n"
        f"{rules}\n"
        f"{ANSWER_FORMAT}"
        f"{worked_example(backend) if example else ''}"
    )


def task_prompt(task_source: str, backend: str) -> str:
    return (f"Here is the reference implementation:\n\n```python\n{task_source.rstrip()}\n```\n\n"
            f"Write `ModelNew` with {BACKEND_LABELS.get(backend, backend)} kernels. {ANSWER_FORMAT}")


def assistant_turn(turn: Turn) -> str:
    """What later prompts keep of a finished turn: the summary and the kernel, no reasoning."""
    parts = [turn.summary.strip()] if turn.summary.strip() else []
    if turn.answer.strip():
        parts.append(f"```python\n{turn.answer.rstrip()}\n```")
    return "\n\n".join(parts) if parts else "(no answer)"


def improve_prompt(feedback: str) -> str:
    return (f"{feedback.rstrip()}\n\nImprove your answer: if it was rejected or wrong, fix it; if it was "
            f"correct, make it faster. {ANSWER_FORMAT}")


def build_messages(task_source: str, backend: str, enabled_rules: Sequence[str],
                   history: Sequence[Turn], example: bool = False) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system_prompt(backend, enabled_rules, example)},
            {"role": "user", "content": task_prompt(task_source, backend)}]
    for turn in history:
        msgs.append({"role": "assistant", "content": assistant_turn(turn)})
        msgs.append({"role": "user", "content": improve_prompt(turn.feedback)})
    return msgs


def render(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    """The prompt text for ``messages`` through the tokenizer's chat template.

    Earlier assistant messages lose any ``<think>...</think>`` reasoning first (some templates do
    this themselves, many do not); the generation prompt for the next assistant turn is appended.
    """
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
        raise ValueError(f"tokenizer {name!r} has no chat_template; a chat model's tokenizer is needed to "
                         "render multi-turn prompts")
    cleaned = [{**m, "content": strip_thinking(m["content"])} if m["role"] == "assistant" else dict(m)
               for m in messages]
    return tokenizer.apply_chat_template(cleaned, tokenize=False, add_generation_prompt=True)
