"""KernelBench level2/9_Matmul_Subtract_Multiply_ReLU: linear, then (y - s) * m and ReLU fused into one pass over the output."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

KERNELS = r"""
#include <cstdint>

// in place over the GEMM's output y[rows, cols]; the same operation order as the reference: subtract, multiply, relu
__global__ void sub_mul_relu(float* __restrict__ y, float s, float m, int64_t n, int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        float v = y[i];
        v = (v - s) * m;
        v = v > 0.f ? v : 0.f;
        y[i] = v;
    }
}
"""

HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

torch::Tensor sub_mul_relu_(torch::Tensor y, double s, double m) {
    TORCH_CHECK(y.is_cuda() && y.is_contiguous() && y.dim() == 2 && y.scalar_type() == torch::kFloat32,
                "expected a contiguous 2-D float32 CUDA tensor");
    const int64_t n = y.numel();
    if (n == 0) return y;
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 64);
    sub_mul_relu<<<(unsigned)blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), (float)s, (float)m, n, y.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="kb_l2_9_tail", cpp_sources="torch::Tensor sub_mul_relu_(torch::Tensor y, double s, double m);",
                   cuda_sources=KERNELS + HOST, functions=["sub_mul_relu_"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, subtract_value, multiply_value):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # same draws as Model's
        self.subtract_value = subtract_value
        self.multiply_value = multiply_value

    def forward(self, x):
        y = F.linear(x, self.linear.weight, self.linear.bias).contiguous()
        return _ext.sub_mul_relu_(y, self.subtract_value, self.multiply_value)
