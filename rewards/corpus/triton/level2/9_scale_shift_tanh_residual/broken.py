"""tanh(x * alpha + beta) * 0.5 + x in one kernel; tanh via exp so it needs no libdevice."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def fused_kernel(x_ptr, out_ptr, n, alpha, beta, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    z = x * alpha + beta
    t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
    tl.store(out_ptr + offs, t * 0.5 + xs, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, alpha: float, beta: float):
        super().__init__()
        self.alpha = alpha
        self.beta = beta

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        fused_kernel[(triton.cdiv(n, 1024),)](x, out, n, self.alpha, self.beta, BLOCK=1024)
        return out
