"""KernelBench level1/19_ReLU: ReLU, float4 loads and stores with a grid-stride loop."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KERNELS = r"""
#include <cstdint>

// 4096 x 393216 elements: indices past 2^31 are near, so every index is 64-bit
__global__ void relu_vec4(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += step) {
        float4 v = x[i];
        v.x = v.x > 0.f ? v.x : 0.f;
        v.y = v.y > 0.f ? v.y : 0.f;
        v.z = v.z > 0.f ? v.z : 0.f;
        v.w = v.w > 0.f ? v.w : 0.f;
        y[i] = v;
    }
}

__global__ void relu_tail(const float* __restrict__ x, float* __restrict__ y, int64_t start, int64_t n) {
    int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""

HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

torch::Tensor relu_fwd(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expected a float32 CUDA tensor");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    // fresh allocations are 256-byte aligned; a view with an offset takes the scalar path only
    const bool aligned = (reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0);
    const int64_t n4 = aligned ? n / 4 : 0;
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (n4 > 0) {
        const int64_t blocks = std::min<int64_t>((n4 + 255) / 256, 132 * 64);
        relu_vec4<<<(unsigned)blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(x.data_ptr<float>()),
                                                        reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
    }
    const int64_t rest = n - n4 * 4;
    if (rest > 0) {
        relu_tail<<<(unsigned)((rest + 255) / 256), 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                                                     n4 * 4, n);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="kb_l1_relu", cpp_sources="torch::Tensor relu_fwd(torch::Tensor x);",
                   cuda_sources=KERNELS + HOST, functions=["relu_fwd"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.relu_fwd(x)
