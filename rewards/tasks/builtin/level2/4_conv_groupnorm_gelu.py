"""3x3 convolution, GroupNorm, GELU."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16
IN_CH = 32
OUT_CH = 64
GROUPS = 8
H = 128
W = 128
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 2, "IN_CH": 3, "OUT_CH": 8, "GROUPS": 2, "H": 12, "W": 12}


class Model(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1)
        self.norm = nn.GroupNorm(groups, out_ch)

    def forward(self, x):
        return F.gelu(self.norm(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CH, H, W)]


def get_init_inputs():
    return [IN_CH, OUT_CH, GROUPS]
