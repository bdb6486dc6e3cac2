"""Row-wise log-softmax over the last dimension."""
import torch
import torch.nn as nn

BATCH = 4096
DIM = 16384
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 32, "DIM": 128}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.log_softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
