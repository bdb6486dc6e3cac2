"""C = A^T @ B where A is stored as (K, M)."""
import torch
import torch.nn as nn

M = 4096
K = 4096
N = 4096
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"M": 40, "K": 24, "N": 32}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a.T, b)


def get_inputs():
    return [torch.randn(K, M), torch.randn(K, N)]


def get_init_inputs():
    return []
