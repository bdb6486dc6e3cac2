"""KernelBench level2/86_Matmul_Divide_GELU: linear, then / divisor and the exact (erf) GELU fused into one pass."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

KERNELS = r"""
#include <cstdint>

// in place over the GEMM's output y[rows, cols]; divide (a division, as the reference, not a multiply by 1/d), then erf GELU
__global__ void div_gelu(float* __restrict__ y, float d, int64_t n, int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        float v = y[i];
        v = v / d;
        v = 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
        y[i] = v;
    }
}
"""

HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

torch::Tensor div_gelu_(torch::Tensor y, double d) {
    TORCH_CHECK(y.is_cuda() && y.is_contiguous() && y.dim() == 2 && y.scalar_type() == torch::kFloat32,
                "expected a contiguous 2-D float32 CUDA tensor");
    const int64_t n = y.numel();
    if (n == 0) return y;
    const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 64);
    div_gelu<<<(unsigned)blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), (float)d, n, y.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="kb_l2_86_tail", cpp_sources="torch::Tensor div_gelu_(torch::Tensor y, double d);",
                   cuda_sources=KERNELS + HOST, functions=["div_gelu_"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, input_size, output_size, divisor):
        super().__init__()
        self.linear = nn.Linear(input_size, output_size)
        self.divisor = divisor

    def forward(self, x):
        y = F.linear(x, self.linear.weight, self.linear.bias).contiguous()
        return _ext.div_gelu_(y, self.divisor)
