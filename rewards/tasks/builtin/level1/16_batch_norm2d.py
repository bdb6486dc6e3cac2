"""BatchNorm2d in training mode (statistics of the batch)."""
import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 64
H = 128
W = 128
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 4, "CHANNELS": 3, "H": 8, "W": 8}


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, H, W)]


def get_init_inputs():
    return [CHANNELS]
