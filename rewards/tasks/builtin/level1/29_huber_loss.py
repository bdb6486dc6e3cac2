"""Huber loss (delta 1.0), mean reduction."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8192
DIM = 4096
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 32, "DIM": 64}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred, target):
        return F.huber_loss(pred, target, delta=1.0)


def get_inputs():
    return [torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
