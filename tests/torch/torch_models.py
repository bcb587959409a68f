"""Helpers shared by the dnntune.torch tests."""

from __future__ import annotations

import torch
from torch import nn


def randomize_batch_norms(model: nn.Module) -> None:
    """Give every BatchNorm2d non-trivial statistics and affine parameters (in place)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
