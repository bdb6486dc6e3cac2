"""Depthwise 3x3 convolution (groups = channels), padding 1, no bias."""
import torch
import torch.nn as nn

BATCH = 16
CHANNELS = 64
H = 256
W = 256
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 2, "CHANNELS": 4, "H": 16, "W": 16}


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1, groups=channels, bias=False)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, H, W)]


def get_init_inputs():
    return [CHANNELS]
