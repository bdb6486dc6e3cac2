"""y = linear(x) * scale + x (square linear layer with a scaled residual)."""
import torch
import torch.nn as nn

BATCH = 4096
FEATURES = 4096
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 16, "FEATURES": 32}


class Model(nn.Module):
    def __init__(self, features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.scale = scale

    def forward(self, x):
        return self.linear(x) * self.scale + x


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [FEATURES, 0.5]
