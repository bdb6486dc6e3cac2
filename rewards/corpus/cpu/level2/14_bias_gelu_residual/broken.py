"""gelu(x + bias) + residual fused into one loop; the bias is read per column."""
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
    const int64_t rows = x.size(0), cols = x.size(1);
    const float* xp = x.data_ptr<float>();
    const float* bp = bias.data_ptr();
    const float* rp = residual.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float inv_sqrt2 = 0.70710678118654752f;
    #pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
            const int64_t i = r * cols + c;
            const float v = xp[i] + bp[c];
            o[i] = 0.5f * v * (1.f + std::erf(v * inv_sqrt2)) + rp[i];
        }
    }
    return out;
}
"""

_ext = load_inline(name="bias_gelu_residual_cpu", cpp_sources=CPP_SRC, functions=["bias_gelu_residual"],
                   extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        # same construction as the reference, so the seeded initialisation matches
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x, residual):
        return _ext.bias_gelu_residual(x.contiguous(), self.bias.contiguous(), residual.contiguous())
