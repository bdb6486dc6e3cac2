"""LayerNorm over the hidden dimension with learnable scale and shift."""
import torch
import torch.nn as nn

ROWS = 8192
HIDDEN = 4096
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"ROWS": 32, "HIDDEN": 64}


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(ROWS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
