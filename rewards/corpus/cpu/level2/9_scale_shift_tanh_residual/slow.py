"""tanh(x * alpha + beta) * 0.5 + x, element by element through tensor accessors."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor scale_shift_tanh_residual(torch::Tensor x, double alpha, double beta) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat, "x must be contiguous float32");
    auto out = torch::empty_like(x);
    auto in = x.accessor<float, 2>();
    auto o = out.accessor<float, 2>();
    const float a = static_cast<float>(alpha), b = static_cast<float>(beta);
    for (int64_t r = 0; r < x.size(0); ++r) {
        for (int64_t c = 0; c < x.size(1); ++c) {
            const float v = in[r][c];
            o[r][c] = std::tanh(v * a + b) * 0.5f + v;
        }
    }
    return out;
}
"""

_ext = load_inline(
    name="scale_shift_tanh_residual_cpu",
    cpp_sources=CPP_SRC,
    functions=["scale_shift_tanh_residual"],
)


class ModelNew(nn.Module):
    def __init__(self, alpha: float, beta: float):
        super().__init__()
        self.alpha = alpha
        self.beta = beta

    def forward(self, x):
        return _ext.scale_shift_tanh_residual(x.contiguous(), self.alpha, self.beta)
