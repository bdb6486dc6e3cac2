"""3x3 convolution, BatchNorm2d (training mode), ReLU."""
import torch
import torch.nn as nn

BATCH = 16
IN_CH = 32
OUT_CH = 64
H = 128
W = 128
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 2, "IN_CH": 3, "OUT_CH": 8, "H": 12, "W": 12}


class Model(nn.Module):
    def __init__(self, in_ch: int, out_ch: int):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(out_ch)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CH, H, W)]


def get_init_inputs():
    return [IN_CH, OUT_CH]
