"""KernelBench level1/47_Sum_reduction_over_a_dimension: sum over one dim, keepdim. The tensor is
viewed as [outer, R, inner]; one thread per (outer, inner) walks R, so neighbouring threads read
neighbouring addresses. The sum is kept in double: 4096 float terms, no drift from torch's."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KERNELS = r"""
#include <cstdint>

__global__ void sum_middle(const float* __restrict__ x, float* __restrict__ y,
                           int64_t outer, int64_t reduce, int64_t inner) {
    const int64_t total = outer * inner;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const int64_t o = t / inner, i = t - o * inner;
        const float* p = x + o * reduce * inner + i;
        double acc = 0.0;
        for (int64_t r = 0; r < reduce; ++r) acc += (double)p[r * inner];
        y[t] = (float)acc;
    }
}
"""

HOST = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

torch::Tensor sum_dim_fwd(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expected a float32 CUDA tensor");
    x = x.contiguous();
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const int64_t reduce = x.size(dim);
    auto sizes = x.sizes().vec();
    sizes[dim] = 1;
    auto y = torch::empty(sizes, x.options());
    const int64_t total = outer * inner;
    if (total == 0) return y;
    const int64_t blocks = std::min<int64_t>((total + 255) / 256, 132 * 64);
    sum_middle<<<(unsigned)blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), outer, reduce, inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="kb_l1_sum_dim", cpp_sources="torch::Tensor sum_dim_fwd(torch::Tensor x, int64_t dim);",
                   cuda_sources=KERNELS + HOST, functions=["sum_dim_fwd"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.sum_dim_fwd(x, self.dim)
