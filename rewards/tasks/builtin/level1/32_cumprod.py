"""Inclusive prefix product along the rows (inputs near 1 keep it finite)."""
import torch
import torch.nn as nn

BATCH = 1024
LENGTH = 16384
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 8, "LENGTH": 64}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cumprod(x, dim=1)


def get_inputs():
    return [1.0 + 0.001 * torch.randn(BATCH, LENGTH)]


def get_init_inputs():
    return []
