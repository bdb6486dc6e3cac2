"""Sigmoid, one vectorised loop."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor sigmoid_forward(torch::Tensor x) {
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = x.numel();
    #pragma omp parallel for simd if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
        const float v = in[i];
        o[i] = 1.f / (1.f + std::exp(-v);
    }
    return out;
}
"""

_ext = load_inline(name="sigmoid_forward_cpu", cpp_sources=CPP_SRC, functions=["sigmoid_forward"],
                   extra_cflags=["-O3", "-ffast-math", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.sigmoid_forward(x.contiguous())
