"""RMSNorm: one thread per row walks its row twice."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                int64_t rows, int cols, float eps) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = x + r * cols;
    float ss = 0.f;
    for (int c = 0; c < cols; ++c) ss += row[c] * row[c];
    const float inv = rsqrtf(ss / cols + eps);
    for (int c = 0; c < cols; ++c) out[r * cols + c] = row[c] * inv * w[c];
}

torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor weight, double eps) {
    auto out = torch::empty_like(x);
    const int64_t rows = x.size(0);
    rms_norm_kernel<<<(rows + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), rows, (int)x.size(1), (float)eps);
    return out;
}
"""

CPP_SRC = "torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor weight, double eps);"

_ext = load_inline(name="rms_norm_rows_cuda", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,
                   functions=["rms_norm_rows"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        # same construction as the reference, so the seeded initialisation matches
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))

    def forward(self, x):
        return _ext.rms_norm_rows(x.contiguous(), self.weight.contiguous(), self.eps)
