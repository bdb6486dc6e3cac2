"""Index of the maximum over one dimension (int64 output)."""
import torch
import torch.nn as nn

BATCH = 16
D1 = 1024
D2 = 1024
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 4, "D1": 32, "D2": 24}


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.argmax(x, dim=self.dim)


def get_inputs():
    return [torch.randn(BATCH, D1, D2)]


def get_init_inputs():
    return [1]
