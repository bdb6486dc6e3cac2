"""Batched matrix product: (B, M, K) @ (B, K, N) -> (B, M, N)."""
import torch
import torch.nn as nn

BATCH = 32
M = 1024
K = 1024
N = 1024
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 4, "M": 24, "K": 16, "N": 20}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
