"""Matrix-vector product: (M, K) @ (K, 1) -> (M, 1)."""
import torch
import torch.nn as nn

M = 8192
K = 16384
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"M": 96, "K": 128}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, v):
        return torch.matmul(a, v)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
