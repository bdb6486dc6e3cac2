"""x + fc2(gelu(fc1(x))): a transformer-style MLP with a residual."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4096
HIDDEN = 2048
FFN = 8192
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 8, "HIDDEN": 32, "FFN": 64}


class Model(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


def get_inputs():
    return [torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, FFN]
