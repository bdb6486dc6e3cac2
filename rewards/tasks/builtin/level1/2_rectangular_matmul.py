"""C = A @ B with A of shape (M, K) and B of shape (K, N)."""
import torch
import torch.nn as nn

M = 4096
K = 2048
N = 8192
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"M": 48, "K": 32, "N": 40}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
