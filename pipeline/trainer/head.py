"""The log-prob head with its chunk math compiled (``trainer.compile_head``).

The trainer's head turns the last hidden states into each target token's log-prob and the
entropy, ``chunk`` rows at a time, and recomputes a chunk's logits in the backward, so the
``[tokens, vocab]`` fp32 logits never exist (verl's ``FusedLinearForPPO``, the default head,
``pipeline/trainer/forward.py``). verl's chunk bodies are eager PyTorch: around ten passes over a
``[chunk, vocab]`` fp32 block in the forward (cast, softmax, logsumexp, the entropy's product and
sum, log_softmax, gather) and as many in the backward (softmax, a one-hot, the gradient's terms,
casts). At Qwen's 151,936-entry vocabulary that block is 622 MB for 1,024 tokens, so the passes,
not the two matmuls, can set the head's time on a GPU. Liger's fused scaled cross-entropy does this
in fused kernels, but on Hopper only through CuTe DSL, which the H200 machine here does not have.
So this module keeps verl's algorithm (same chunking, same recompute, the same formulas in the
same order and dtypes) and hands each chunk body to ``torch.compile``, which fuses the elementwise
work around the matmuls into a few reductions. Parity with verl's head:
tests/pipeline/trainer/test_head.py.
"""
from __future__ import annotations

import functools
from typing import Any

import torch


def _chunk_forward(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = ((hidden @ weight.t()) / temperature).float()
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    entropy = lse - (probs * logits).sum(-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    return logp, entropy.to(hidden.dtype)


def _chunk_backward(dlogp: torch.Tensor | None, dentropy: torch.Tensor | None, hidden: torch.Tensor,
                    weight: torch.Tensor, targets: torch.Tensor,
                    temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = ((hidden @ weight.t()) / temperature).float()
    probs = torch.softmax(logits, dim=-1)
    grad = torch.zeros_like(logits)
    if dlogp is not None:
        # d log p_t / d logits = onehot(t) - p; a comparison the compiler fuses, not a scatter
        onehot = (torch.arange(logits.shape[-1], device=logits.device) == targets.unsqueeze(-1)).float()
        grad = grad + dlogp.float().unsqueeze(-1) * (onehot - probs)
    if dentropy is not None:
        log_probs = torch.log_softmax(logits, dim=-1)
        entropy = torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
        grad = grad + probs * (log_probs + entropy.unsqueeze(-1)) * (-dentropy.float().unsqueeze(-1))
    grad = grad.to(hidden.dtype) / temperature
    return grad @ weight, grad.t() @ hidden


@functools.cache
def _bodies() -> tuple[Any, Any]:
    """The two chunk bodies, compiled once per process (a new chunk length, the last chunk's,
    makes torch.compile retrace once with a dynamic length)."""
    return torch.compile(_chunk_forward), torch.compile(_chunk_backward)


class _CompiledHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                temperature: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        fwd, _ = _bodies()
        shape = targets.shape
        h, t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        logp = torch.empty(t.shape[0], device=h.device, dtype=torch.float32)
        entropy = h.new_empty(t.shape[0])
        for lo in range(0, t.shape[0], chunk):
            logp[lo:lo + chunk], entropy[lo:lo + chunk] = fwd(h[lo:lo + chunk], weight, t[lo:lo + chunk],
                                                              temperature)
        ctx.save_for_backward(h, weight, t)
        ctx.temperature, ctx.chunk, ctx.hidden_shape = temperature, chunk, hidden.shape
        return logp.view(shape), entropy.view(shape)

    @staticmethod
    def backward(ctx: Any, dlogp: torch.Tensor | None, dentropy: torch.Tensor | None):
        _, bwd = _bodies()
        h, weight, t = ctx.saved_tensors
        chunk = ctx.chunk
        dlogp = dlogp.reshape(-1) if dlogp is not None else None
        dentropy = dentropy.reshape(-1) if dentropy is not None else None
        dh = torch.zeros_like(h) if ctx.needs_input_grad[0] else None
        dw = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for lo in range(0, t.shape[0], chunk):
            gh, gw = bwd(dlogp[lo:lo + chunk] if dlogp is not None else None,
                         dentropy[lo:lo + chunk] if dentropy is not None else None,
                         h[lo:lo + chunk], weight, t[lo:lo + chunk], ctx.temperature)
            if dh is not None:
                dh[lo:lo + chunk] = gh
            if dw is not None:
                dw += gw
        return (dh.view(ctx.hidden_shape) if dh is not None else None), dw, None, None, None


class CompiledLogProbHead(torch.nn.Module):
    """``head(hidden [.., d], weight [V, d], targets [..], temperature)`` -> (log-probs fp32,
    entropy in the hidden dtype), both shaped like ``targets``: the call verl's
    ``FusedLinearForPPO`` answers, with the chunk bodies compiled."""

    def __init__(self, chunk_size: int) -> None:
        super().__init__()
        self.chunk_size = int(chunk_size)

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        return _CompiledHead.apply(hidden, weight, targets.to(torch.int64), float(temperature), self.chunk_size)
