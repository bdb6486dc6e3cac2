"""Hard-swish, one vectorised loop."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor hardswish_forward(torch::Tensor x) {
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = x.numel();
    #pragma omp parallel for simd if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
        const float v = in[i];
        o[i] = v * std::min(std::max(v + 3.f, 0), 6.f) / 6.f;
    }
    return out;
}
"""

_ext = load_inline(name="hardswish_forward_cpu", cpp_sources=CPP_SRC, functions=["hardswish_forward"],
                   extra_cflags=["-O3", "-ffast-math", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.hardswish_forward(x.contiguous())
