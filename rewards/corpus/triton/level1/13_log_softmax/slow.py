"""Row-wise log-softmax: one program walks every row, the whole row in registers."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def log_softmax_kernel(x_ptr, out_ptr, rows, cols, BLOCK: tl.constexpr):
    for row in range(0, rows):
        offs = tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        tl.store(out_ptr + row * cols + offs, x - tl.log(tl.sum(tl.exp(x), axis=0)), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, cols = x.shape
        log_softmax_kernel[(1,)](x, out, rows, cols, BLOCK=triton.next_power_of_2(cols))
        return out
