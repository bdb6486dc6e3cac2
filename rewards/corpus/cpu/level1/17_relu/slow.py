"""ReLU, element by element through tensor accessors."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == torch::kFloat, "x must be contiguous float32");
    auto out = torch::empty_like(x);
    auto in = x.accessor<float, 2>();
    auto o = out.accessor<float, 2>();
    for (int64_t r = 0; r < x.size(0); ++r) {
        for (int64_t c = 0; c < x.size(1); ++c) {
            o[r][c] = in[r][c] > 0.f ? in[r][c] : 0.f;
        }
    }
    return out;
}
"""

_ext = load_inline(name="relu_cpu", cpp_sources=CPP_SRC, functions=["relu_forward"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.relu_forward(x.contiguous())
