"""Minimum over the first dimension of a 2-D tensor (values only)."""
import torch
import torch.nn as nn

ROWS = 8192
COLS = 4096
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"ROWS": 48, "COLS": 32}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.min(x, dim=0).values


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
