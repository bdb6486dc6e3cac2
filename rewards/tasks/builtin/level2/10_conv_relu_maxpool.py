"""3x3 convolution, ReLU, 2x2 max pooling."""
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
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CH, H, W)]


def get_init_inputs():
    return [IN_CH, OUT_CH]
