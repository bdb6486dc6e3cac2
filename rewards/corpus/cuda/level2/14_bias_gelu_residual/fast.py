"""gelu(x + bias) + residual in one kernel, one thread per element; the bias is read per column."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__global__ void bias_gelu_residual_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                          const float* __restrict__ res, float* __restrict__ out, int64_t n, int cols) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = x[i] + bias[i % cols];
        out[i] = 0.5f * v * (1.f + erff(v * 0.70710678f)) + res[i];
    }
}

torch::Tensor bias_gelu_residual(torch::Tensor x, torch::Tensor bias, torch::Tensor residual) {
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    bias_gelu_residual_kernel<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), bias.data_ptr<float>(), residual.data_ptr<float>(), out.data_ptr<float>(), n,
        (int)x.size(1));
    return out;
}
"""

CPP_SRC = "torch::Tensor bias_gelu_residual(torch::Tensor x, torch::Tensor bias, torch::Tensor residual);"

_ext = load_inline(name="bias_gelu_residual_cuda", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,
                   functions=["bias_gelu_residual"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        # same construction as the reference, so the seeded initialisation matches
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x, residual):
        return _ext.bias_gelu_residual(x.contiguous(), self.bias.contiguous(), residual.contiguous())
