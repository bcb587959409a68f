"""PyTorch integration: tuned, verified, persistent kernels for a user's model.

``dnntune.torch.conv2d`` / ``linear`` / ``scaled_dot_product_attention`` / ``layer_norm`` /
``rms_norm`` / ``batch_norm`` / ``max_pool2d`` / ``avg_pool2d`` match ``torch.nn.functional``;
``optimize(model)`` swaps a model's layers in place; ``configure`` sets the policy
("heuristic", "tune", "cached") and the override file.
"""

from dnntune.torch._subclass import ScriptNotSupportedError
from dnntune.torch._support import DnnTuneFallbackWarning
from dnntune.torch.config import TorchConfig, configure
from dnntune.torch.functional import (
    avg_pool2d,
    batch_norm,
    conv2d,
    layer_norm,
    linear,
    max_pool2d,
    rms_norm,
    scaled_dot_product_attention,
)
from dnntune.torch.optimize import OptimizeReport, optimize
from dnntune.torch.runtime import runtime_stats
from dnntune.torch.speed import DnnTuneSlowerWarning

__all__ = [
    "DnnTuneFallbackWarning",
    "DnnTuneSlowerWarning",
    "OptimizeReport",
    "ScriptNotSupportedError",
    "TorchConfig",
    "avg_pool2d",
    "batch_norm",
    "configure",
    "conv2d",
    "layer_norm",
    "linear",
    "max_pool2d",
    "optimize",
    "rms_norm",
    "runtime_stats",
    "scaled_dot_product_attention",
]
