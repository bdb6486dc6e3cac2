"""RMSNorm: the sum of squares and the scaling of a row in two vectorised sweeps."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor weight, double eps) {
    auto out = torch::empty_like(x);
    const int64_t rows = x.size(0), cols = x.size(1);
    const float* in = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for if (rows * cols > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float ss = 0.f;
        #pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < cols; ++c) ss += row[c] * row[c];
        const float inv = 1.f / std::sqrt(ss + static_cast<float>(eps));
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = row[c] * inv * w[c];
    }
    return out;
}
"""

_ext = load_inline(name="rms_norm_rows_cpu", cpp_sources=CPP_SRC, functions=["rms_norm_rows"],
                   extra_cflags=["-O3", "-ffast-math", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        # same construction as the reference, so the seeded initialisation matches
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))

    def forward(self, x):
        return _ext.rms_norm_rows(x.contiguous(), self.weight.contiguous(), self.eps)
