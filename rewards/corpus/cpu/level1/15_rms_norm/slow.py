"""RMSNorm, element by element through tensor accessors."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor weight, double eps) {
    auto out = torch::empty_like(x);
    auto in = x.accessor<float, 2>();
    auto w = weight.accessor<float, 1>();
    auto o = out.accessor<float, 2>();
    for (int64_t r = 0; r < x.size(0); ++r) {
        float ss = 0.f;
        for (int64_t c = 0; c < x.size(1); ++c) ss += in[r][c] * in[r][c];
        const float inv = 1.f / std::sqrt(ss / x.size(1) + static_cast<float>(eps));
        for (int64_t c = 0; c < x.size(1); ++c) o[r][c] = in[r][c] * inv * w[c];
    }
    return out;
}
"""

_ext = load_inline(name="rms_norm_rows_cpu", cpp_sources=CPP_SRC, functions=["rms_norm_rows"])


class ModelNew(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        # same construction as the reference, so the seeded initialisation matches
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))

    def forward(self, x):
        return _ext.rms_norm_rows(x.contiguous(), self.weight.contiguous(), self.eps)
