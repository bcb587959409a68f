"""The shared ATen interpreter of TORCH_ENGINE and TORCH_COMPILE_ENGINE.

A graph is lowered once (:func:`lower`) into a :class:`Program`: one closure per node, in
topological order, over a slot array. TORCH_ENGINE runs the program as is; TORCH_COMPILE_ENGINE
runs it under ``torch.compile``.
"""

from dnntune.providers._torch.lowering import lower
from dnntune.providers._torch.program import LoweringOptions, Program, dummy_args

__all__ = ["LoweringOptions", "Program", "dummy_args", "lower"]
