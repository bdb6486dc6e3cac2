"""KernelBench level2/76_Gemm_Add_ReLU: bias-free linear, then + bias (per column) and ReLU fused into one pass."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

KERNELS = r"""
#include <cstdint>

// in place over the GEMM's output y[rows, cols]; add the column's bias, then relu
__global__ void bias_relu(float* __restrict__ y, const float* __restrict__ bias, int64_t n, int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        float v = y[i];
        v = v + bias[i % cols];
        v = v > 0.f ? v : 0.f;
        y[i] = v;
    }
}
"""

HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

torch::Tensor bias_relu_(torch::Tensor y, torch::Tensor bias) {
    TORCH_CHECK(y.is_cuda() && y.is_contiguous() && y.dim() == 2 && y.scalar_type() == torch::kFloat32,
                "expected a contiguous 2-D float32 CUDA tensor");
    TORCH_CHECK(bias.is_cuda() && bias.is_contiguous() && bias.numel() == y.size(1) &&
                bias.scalar_type() == torch::kFloat32, "bias must be float32 [cols] on the GPU");
    const int64_t n = y.numel();
    if (n == 0) return y;
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 64);
    bias_relu<<<(unsigned)blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), bias.data_ptr<float>(), n, y.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="kb_l2_76_tail", cpp_sources="torch::Tensor bias_relu_(torch::Tensor y, torch::Tensor bias);",
                   cuda_sources=KERNELS + HOST, functions=["bias_relu_"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)  # then the bias: Model's order
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        y = F.linear(x, self.gemm.weight).contiguous()
        return _ext.bias_relu_(y, self.bias.contiguous())
