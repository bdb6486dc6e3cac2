"""GELU activation (exact, erf form)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8192
DIM = 4096
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 32, "DIM": 64}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.gelu(x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
