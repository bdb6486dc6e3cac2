"""gelu(x + bias) + residual, element by element through tensor accessors."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor bias_gelu_residual(torch::Tensor x, torch::Tensor bias, torch::Tensor residual) {
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && residual.is_contiguous() && bias.is_contiguous(),
                "contiguous 2-D inputs expected");
    auto out = torch::empty_like(x);
    auto xa = x.accessor<float, 2>();
    auto ba = bias.accessor<float, 1>();
    auto ra = residual.accessor<float, 2>();
    auto o = out.accessor<float, 2>();
    const float inv_sqrt2 = 0.70710678118654752f;
    for (int64_t r = 0; r < x.size(0); ++r) {
        for (int64_t c = 0; c < x.size(1); ++c) {
            const float v = xa[r][c] + ba[c];
            o[r][c] = 0.5f * v * (1.f + std::erf(v * inv_sqrt2)) + ra[r][c];
        }
    }
    return out;
}
"""

_ext = load_inline(name="bias_gelu_residual_cpu", cpp_sources=CPP_SRC, functions=["bias_gelu_residual"])


class ModelNew(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        # same construction as the reference, so the seeded initialisation matches
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x, residual):
        return _ext.bias_gelu_residual(x.contiguous(), self.bias.contiguous(), residual.contiguous())
