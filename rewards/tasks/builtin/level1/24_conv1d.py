"""1-D convolution, stride 1, no padding, with bias."""
import torch
import torch.nn as nn

BATCH = 64
IN_CH = 64
OUT_CH = 128
LENGTH = 16384
KSIZE = 3
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 2, "IN_CH": 4, "OUT_CH": 8, "LENGTH": 64, "KSIZE": 3}


class Model(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, ksize: int):
        super().__init__()
        self.conv = nn.Conv1d(in_ch, out_ch, ksize)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CH, LENGTH)]


def get_init_inputs():
    return [IN_CH, OUT_CH, KSIZE]
