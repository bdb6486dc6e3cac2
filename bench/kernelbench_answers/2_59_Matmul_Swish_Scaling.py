"""KernelBench level2/59_Matmul_Swish_Scaling: linear, then swish (y * sigmoid(y)) and the scaling fused into one pass."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

KERNELS = r"""
#include <cstdint>

// in place over the GEMM's output y[rows, cols]; swish then scale; sigmoid as 1 / (1 + exp(-v))
__global__ void swish_scale(float* __restrict__ y, float scale, int64_t n, int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        float v = y[i];
        v = v * (1.f / (1.f + expf(-v)));
        v = v * scale;
        y[i] = v;
    }
}
"""

HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

torch::Tensor swish_scale_(torch::Tensor y, double scale) {
    TORCH_CHECK(y.is_cuda() && y.is_contiguous() && y.dim() == 2 && y.scalar_type() == torch::kFloat32,
                "expected a contiguous 2-D float32 CUDA tensor");
    const int64_t n = y.numel();
    if (n == 0) return y;
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 64);
    swish_scale<<<(unsigned)blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), (float)scale, n, y.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="kb_l2_59_tail", cpp_sources="torch::Tensor swish_scale_(torch::Tensor y, double scale);",
                   cuda_sources=KERNELS + HOST, functions=["swish_scale_"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        y = F.linear(x, self.matmul.weight, self.matmul.bias).contiguous()
        return _ext.swish_scale_(y, self.scaling_factor)
