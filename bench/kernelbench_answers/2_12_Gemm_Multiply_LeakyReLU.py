"""KernelBench level2/12_Gemm_Multiply_LeakyReLU: linear, then y * multiplier and LeakyReLU fused into one pass over the output."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

KERNELS = r"""
#include <cstdint>

// in place over the GEMM's output y[rows, cols]; multiply, then leaky relu (x > 0 ? x : x * slope, as torch)
__global__ void mul_leaky_relu(float* __restrict__ y, float mult, float slope, int64_t n, int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        float v = y[i];
        v = v * mult;
        v = v > 0.f ? v : v * slope;
        y[i] = v;
    }
}
"""

HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

torch::Tensor mul_leaky_relu_(torch::Tensor y, double mult, double slope) {
    TORCH_CHECK(y.is_cuda() && y.is_contiguous() && y.dim() == 2 && y.scalar_type() == torch::kFloat32,
                "expected a contiguous 2-D float32 CUDA tensor");
    const int64_t n = y.numel();
    if (n == 0) return y;
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 64);
    mul_leaky_relu<<<(unsigned)blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), (float)mult, (float)slope, n, y.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="kb_l2_12_tail", cpp_sources="torch::Tensor mul_leaky_relu_(torch::Tensor y, double mult, double slope);",
                   cuda_sources=KERNELS + HOST, functions=["mul_leaky_relu_"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x):
        y = F.linear(x, self.gemm.weight, self.gemm.bias).contiguous()
        return _ext.mul_leaky_relu_(y, self.multiplier, self.negative_slope)
