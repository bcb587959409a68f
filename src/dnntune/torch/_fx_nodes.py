"""What a node of a module's ``torch.fx`` trace is and does, for the fusion patterns of
:mod:`dnntune.torch.fusion`: which activation, add or child call it is, whether it writes a
tensor in place, whether it is a number argument, and the dropouts an eval-mode trace holds
that return their input."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from dnntune.torch._activations import activation_name
from dnntune.torch._fused_parts import plain
from dnntune.torch._tracing import AUGMENTED

__all__ = [
    "child_call",
    "drop_eval_dropouts",
    "in_place_add",
    "is_add",
    "is_mul",
    "is_relu",
    "module_attr",
    "module_call",
    "node_activation",
    "number_argument",
    "retarget_calls",
    "written_between",
    "writes_in_place",
]

_ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)
_RELU_FUNCTIONS = (torch.relu, F.relu, torch.relu_)
#: Python's augmented assignments (``x += y``: the trace records them in place, _tracing.py)
#: and item assignment
_IN_PLACE_OPERATORS = frozenset(getattr(operator, name) for name in (*AUGMENTED, "setitem"))


def is_relu(node: fx.Node, module: nn.Module) -> bool:
    """``node`` computes a ReLU of its one input, in any spelling, not in place."""
    if node.op == "call_function" and node.target in _RELU_FUNCTIONS:
        return len(node.args) == 1 and not node.kwargs.get("inplace", False)
    if node.op == "call_method" and node.target in ("relu", "relu_"):
        return len(node.args) == 1
    if node.op == "call_module":
        return activation_name(module.get_submodule(str(node.target))) == "relu"
    return False


def node_activation(node: fx.Node, module: nn.Module) -> str | None:
    """The dnntune activation ``node`` computes on its one tensor input, or None."""
    if node.op == "call_module":
        return activation_name(module.get_submodule(str(node.target)))
    if len(node.args) != 1:
        return None
    if node.op == "call_method":
        return {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}.get(str(node.target))
    if node.op != "call_function":
        return None
    if node.target is F.gelu:
        approximate = node.kwargs.get("approximate", "none")
        if set(node.kwargs) - {"approximate"} or approximate not in ("none", "tanh"):
            return None
        return "gelu_tanh" if approximate == "tanh" else "gelu"
    if set(node.kwargs) - {"inplace"}:
        return None
    target: Any = node.target
    return _ACTIVATION_FUNCTIONS.get(target)


_ACTIVATION_FUNCTIONS: dict[Any, str] = {
    torch.relu: "relu",
    F.relu: "relu",
    F.silu: "silu",
    torch.sigmoid: "sigmoid",
    torch.tanh: "tanh",
}


def module_attr(graph: fx.Graph, node: fx.Node | None) -> fx.Node | None:
    """The module a ``call_module`` node calls, as a ``get_attr`` node (its hooks must still
    run when the fused call is declined), else None (a function or method)."""
    if node is None or node.op != "call_module":
        return None
    return graph.get_attr(str(node.target))


#: PyTorch's dropout functions: (input, p, training, inplace)
_DROPOUTS = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout)


def drop_eval_dropouts(graph: fx.Graph) -> None:
    """Take out the dropout calls the trace holds with ``training=False`` (the eval mode's
    trace of ``F.dropout(x, p, training=self.training)``): each returns its input, so the
    patterns see the layer's output reach the activation or the add."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _DROPOUTS or not node.args:
            continue
        training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
        if training is False and isinstance(node.args[0], fx.Node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def is_add(node: fx.Node) -> bool:
    """``node`` adds two values (``+``, ``+=``, ``torch.add``, ``.add``, ``.add_``)."""
    if node.op == "call_function" and node.target in _ADD_FUNCTIONS:
        return len(node.args) == 2 and not node.kwargs
    if node.op == "call_method" and node.target in ("add", "add_"):
        return len(node.args) == 2 and not node.kwargs
    return False


def is_mul(node: fx.Node) -> bool:
    """``node`` multiplies two values, not in place (``*``, ``torch.mul``, ``.mul``)."""
    if node.op == "call_function" and node.target in (operator.mul, torch.mul):
        return len(node.args) == 2 and not node.kwargs
    if node.op == "call_method" and node.target == "mul":
        return len(node.args) == 2 and not node.kwargs
    return False


def writes_in_place(node: fx.Node, module: nn.Module) -> bool:
    """Whether ``node`` may write a tensor it is given (its first argument, mostly): an
    augmented assignment, a ``*_`` method or function (``x.add_(y)``, ``torch.relu_``), an
    ``inplace=True`` call or module."""
    if node.op == "call_function":
        target: Any = node.target
        name = getattr(target, "__name__", "")
        return (
            target in _IN_PLACE_OPERATORS
            or node.kwargs.get("inplace") is True
            or (name.endswith("_") and not name.startswith("_"))
        )
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") and not name.startswith("_")
    if node.op == "call_module":
        return getattr(module.get_submodule(str(node.target)), "inplace", False) is True
    return False


def written_between(
    first: fx.Node, last: fx.Node, module: nn.Module, fused: tuple[fx.Node, ...] = ()
) -> bool:
    """Whether a node after ``first`` and before ``last`` (other than the ``fused`` ones) may
    write in place: the fused call made at ``last`` computes ``first``'s layer there, and
    would read its input (or the residual) after the write, where the forward read it
    before."""
    node = first.next
    while node is not last and node.op != "root":
        if node not in fused and writes_in_place(node, module):
            return True
        node = node.next
    return False


def child_call(node: Any, module: nn.Module) -> nn.Module | None:
    """The child ``node`` calls on one input, its output used once, else None."""
    if (
        isinstance(node, fx.Node)
        and node.op == "call_module"
        and len(node.users) == 1
        and len(node.args) == 1
        and not node.kwargs
        and isinstance(node.args[0], fx.Node)
    ):
        return module.get_submodule(str(node.target))
    return None


def module_call(node: Any, module: nn.Module, kind: type[nn.Module]) -> bool:
    """``node`` is a one-input call of a ``kind`` child (exactly ``kind``, or dnntune's class in
    its place: :func:`plain`), used once."""
    child = child_call(node, module)
    return child is not None and plain(child, kind)


def in_place_add(node: fx.Node) -> bool:
    """``a += b`` or ``a.add_(b)``: the add writes its left operand."""
    return node.target is operator.iadd or node.target == "add_"


#: the types an argument of the forward may be annotated with or default to that make it no
#: residual tensor (``relu(conv(x) + shift)``), and their names (a string annotation: ``from
#: __future__ import annotations``)
_NUMBERS = (bool, int, float, complex)
_NUMBER_NAMES = frozenset(t.__name__ for t in _NUMBERS)


def number_argument(node: fx.Node) -> bool:
    """Whether ``node`` is an argument of the forward known to be a number (its annotation or
    default): the add is then no residual add."""
    if node.op != "placeholder":
        return False
    annotation = node.type
    return (
        annotation in _NUMBERS
        or (isinstance(annotation, str) and annotation.strip("'\"") in _NUMBER_NAMES)
        or (bool(node.args) and isinstance(node.args[0], _NUMBERS))
    )


def retarget_calls(graph: fx.Graph, retarget: Mapping[Any, Callable[..., Any]] | None) -> None:
    """Point ``graph``'s calls of the functions ``retarget`` names at their replacements: a
    trace records the functions it saw, and the calls ``optimize`` routes to dnntune
    (``F.scaled_dot_product_attention``, pooling) must keep going through the router in a
    rewritten forward and in a child's head alike."""
    if not retarget:
        return
    for node in graph.nodes:
        if node.op == "call_function" and node.target in retarget:
            node.target = retarget[node.target]
