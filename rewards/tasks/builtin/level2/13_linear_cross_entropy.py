"""Classifier head: cross-entropy of linear(x) against integer targets."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4096
IN_FEATURES = 1024
CLASSES = 8192
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 16, "IN_FEATURES": 32, "CLASSES": 12}


class Model(nn.Module):
    def __init__(self, in_features: int, classes: int):
        super().__init__()
        self.head = nn.Linear(in_features, classes)

    def forward(self, x, target):
        return F.cross_entropy(self.head(x), target)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES), torch.randint(0, CLASSES, (BATCH,))]


def get_init_inputs():
    return [IN_FEATURES, CLASSES]
