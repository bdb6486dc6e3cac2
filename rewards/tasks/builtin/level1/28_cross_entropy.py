"""Cross-entropy of logits against integer class targets, mean over the batch."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4096
CLASSES = 8192
# Small sizes for CPU runs (the loader substitutes them for profile 'cpu').
CPU_SIZES = {"BATCH": 16, "CLASSES": 10}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits, target):
        return F.cross_entropy(logits, target)


def get_inputs():
    return [torch.randn(BATCH, CLASSES), torch.randint(0, CLASSES, (BATCH,))]


def get_init_inputs():
    return []
