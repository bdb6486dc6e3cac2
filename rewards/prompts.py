"""Chat messages for each turn, and rendering them through a tokenizer's chat template.

Turn 1: system (role, backend, rules, answer format) + user (the task source). Turn t > 1: the
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


def system_prompt(backend: str, enabled_rules: Sequence[str]) -> str:
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
                   history: Sequence[Turn]) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system_prompt(backend, enabled_rules)},
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
