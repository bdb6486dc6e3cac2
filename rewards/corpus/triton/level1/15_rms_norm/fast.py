"""RMSNorm: one program per row, the whole row in registers."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)
    w = tl.load(w_ptr + offs, mask=mask)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / cols + eps)
    tl.store(out_ptr + row * cols + offs, x * inv * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        # same construction as the reference, so the seeded initialisation matches
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, cols = x.shape
        rms_norm_kernel[(rows,)](x, self.weight, out, cols, self.eps, BLOCK=triton.next_power_of_2(cols))
        return out
