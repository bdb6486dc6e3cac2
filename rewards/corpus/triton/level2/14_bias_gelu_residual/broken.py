"""gelu(x + bias) + residual in one kernel, one program per block of 1024 elements."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def bias_gelu_residual_kernel(x_ptr, b_ptr, r_ptr, out_ptr, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask) + tl.load(b_ptr + offs % cols, mask=mask)
    y = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476)) + tl.load(res_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        # same construction as the reference, so the seeded initialisation matches
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x, residual):
        x, residual = x.contiguous(), residual.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        bias_gelu_residual_kernel[(triton.cdiv(n, 1024),)](x, self.bias, residual, out, n, x.shape[1], BLOCK=1024)
        return out
