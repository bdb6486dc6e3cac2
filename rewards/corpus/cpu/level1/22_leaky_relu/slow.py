"""Leaky ReLU, element by element through tensor accessors."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor leaky_relu_forward(torch::Tensor x, double slope) {
    auto out = torch::empty_like(x);
    auto in = x.accessor<float, 2>();
    auto o = out.accessor<float, 2>();
    const float s = static_cast<float>(slope);
    for (int64_t r = 0; r < x.size(0); ++r) {
        for (int64_t c = 0; c < x.size(1); ++c) {
            const float v = in[r][c];
            o[r][c] = v > 0.f ? v : v * s;
        }
    }
    return out;
}
"""

_ext = load_inline(name="leaky_relu_forward_cpu", cpp_sources=CPP_SRC, functions=["leaky_relu_forward"])


class ModelNew(nn.Module):
    def __init__(self, negative_slope):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return _ext.leaky_relu_forward(x.contiguous(), self.negative_slope)
