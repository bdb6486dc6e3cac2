"""SwiGLU feed-forward: down(silu(gate(x)) * up(x)), no biases."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4096
HIDDEN = 2048
FFN = 5632
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 8, "HIDDEN": 32, "FFN": 48}


class Model(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, FFN]
