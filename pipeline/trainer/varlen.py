"""``attn_implementation="varlen"``: causal attention over packed rows (``trainer.remove_padding``)
without a dense mask, registered with transformers' ``AttentionInterface`` (its hook for custom
attention: no module is patched).

The sequences of a ``[1, T]`` packed row are told apart by ``cu_seq_lens_q`` / ``max_length_q``,
the keyword arguments transformers forwards from the model's forward to every attention call (the
same ones its flash-attention path reads). The kernel is torch's own
``torch.nn.attention.varlen.varlen_attn`` (flash attention for cu_seqlens, in torch since 2.10):
flash-attn has no wheel for the H200's torch 2.11 + CUDA 13, and this needs none. Where that
kernel cannot run (CPU, fp32) each sequence goes through causal SDPA on its own: exact, slow, and
what the CPU parity tests exercise. Nothing here is a kernel of its own; it only adapts layouts.
"""
from __future__ import annotations

import inspect
import warnings

import torch

NAME = "varlen"


def _load_kernel():
    """torch's varlen_attn and the keywords its version takes (2.10: ``is_causal``; later:
    ``window_size=(-1, 0)`` and ``enable_gqa``), or None when this torch has none. Looked up once,
    by :func:`register`, outside any compiled region (inspect would break a torch.compile graph)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


_KERNEL = None


def kernel_available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and _KERNEL is not None


def _with_kernel(q, k, v, cu, max_len, scale):
    """q ``[T, H, D]``, k/v ``[T, H_kv, D]`` -> ``[T, H, D]`` through torch's varlen kernel."""
    fn, params = _KERNEL
    kw = {}
    if "window_size" in params:
        kw["window_size"] = (-1, 0)  # causal
    else:
        kw["is_causal"] = True
    if "scale" in params:
        kw["scale"] = scale
    elif scale is not None:  # the kernel's default is 1/sqrt(D)
        q = q * (scale * q.shape[-1] ** 0.5)
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return fn(q, k, v, cu, cu, max_len, max_len, **kw)


def _per_sequence(query, key, value, cu, scale):
    """``[1, H, T, D]`` inputs, one causal SDPA per sequence -> ``[T, H, D]``."""
    bounds = cu.tolist()
    gqa = key.shape[1] != query.shape[1]
    outs = [torch.nn.functional.scaled_dot_product_attention(
        query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=True, scale=scale, enable_gqa=gqa)
        for s, e in zip(bounds[:-1], bounds[1:])]
    return torch.cat(outs, dim=2)[0].transpose(0, 1)


def varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None,
                     dropout: float = 0.0, sliding_window: int | None = None,
                     cu_seq_lens_q: torch.Tensor | None = None, max_length_q: int | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``[B, H, T, D]`` query, ``[B, H_kv, T, D]``
    key/value in; ``([B, T, H, D]``, no weights) out. Here B is 1: one packed row."""
    if cu_seq_lens_q is None or query.shape[0] != 1:
        raise ValueError(f"attn_implementation={NAME!r} attends over packed rows only: the forward "
                         "needs one [1, T] row and cu_seq_lens_q/max_length_q "
                         "(trainer.remove_padding); padded rows need sdpa or flash_attention_2")
    if attention_mask is not None or sliding_window is not None or dropout:
        raise ValueError(f"attn_implementation={NAME!r}: no attention mask, sliding window or "
                         "attention dropout (the packed causal case only)")
    cu = cu_seq_lens_q.to(device=query.device, dtype=torch.int32)
    if kernel_available(query.device, query.dtype):
        out = _with_kernel(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                           cu, max_length_q, scaling)  # no int(): under torch.compile it is a SymInt
    else:
        if query.is_cuda:  # correct but a launch per sequence: say so, once
            warnings.warn(f"attn_implementation={NAME!r} on CUDA without torch's varlen kernel for "
                          f"{query.dtype} (it needs bf16/fp16 and torch >= 2.10): one SDPA per sequence")
        out = _per_sequence(query, key, value, cu, scaling)
    return out.unsqueeze(0), None


def register() -> None:
    """Make ``attn_implementation="varlen"`` known to transformers (idempotent). No mask function
    is registered with it: transformers then builds no mask for it, which is the point."""
    global _KERNEL
    from transformers import AttentionInterface

    _KERNEL = _load_kernel()
    AttentionInterface.register(NAME, varlen_attention)
