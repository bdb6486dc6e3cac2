"""Leaky ReLU, one vectorised loop."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor leaky_relu_forward(torch::Tensor x, double slope) {
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = x.numel();
    const float s = static_cast<float>(slope);
    #pragma omp parallel for simd if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
        const float v = in[i];
        o[i] = v > 0.f ? v : v * slope_f;
    }
    return out;
}
"""

_ext = load_inline(name="leaky_relu_forward_cpu", cpp_sources=CPP_SRC, functions=["leaky_relu_forward"],
                   extra_cflags=["-O3", "-ffast-math", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self, negative_slope):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return _ext.leaky_relu_forward(x.contiguous(), self.negative_slope)
