"""Every flag of the Graph API takes a bool and refuses anything else where it is given, with
an InvalidTypeError (a TypeError and an InvalidValueError) naming the field and the value. A
string was kept as given and read as true: ``set_output("False")`` made the tensor a graph
output (new-user audit). NumPy bools are taken as the Python bool they hold."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import dnntune as dt

F = dt.DataType.FLOAT
NOT_BOOLS = ["False", "True", "false", 0, 1, 1.0, None]


def _relu() -> tuple[dt.Graph, dt.TensorAttributes, dt.TensorAttributes]:
    g = dt.Graph(name="relu", io_data_type=F, compute_data_type=F)
    x = g.tensor(name="X", dims=[2, 3])
    y = g.pointwise(x, mode=dt.PointwiseMode.RELU_FWD, name="relu")
    return g, x, y


def _sdpa(**flags: Any) -> dt.Graph:
    g = dt.Graph(name="attn", io_data_type=F, compute_data_type=F)
    q, k, v = (g.tensor(name=n, dims=[1, 2, 4, 8]) for n in "QKV")
    for t in g.sdpa(q, k, v, name="attn", **flags):
        t.set_output(True)
    return g


#: (what the message names, a call passing the flag)
TENSOR_FLAGS: dict[str, tuple[str, Callable[[Any], object]]] = {
    "set_output": ("tensor 'relu::OUT_0': is_output", lambda f: _relu()[2].set_output(f)),
    "set_is_virtual": ("tensor 'relu::OUT_0': is_virtual", lambda f: _relu()[2].set_is_virtual(f)),
    "assign is_output": ("tensor 'X': is_output", lambda f: setattr(_relu()[1], "is_output", f)),
    "assign is_virtual": ("tensor 'X': is_virtual", lambda f: setattr(_relu()[1], "is_virtual", f)),
    "TensorAttributes(is_output)": (
        "tensor 'T': is_output",
        lambda f: dt.TensorAttributes(name="T", dims=[2], is_output=f),
    ),
    "TensorAttributes(is_virtual)": (
        "tensor 'T': is_virtual",
        lambda f: dt.TensorAttributes(name="T", dims=[2], is_virtual=f),
    ),
    "Graph.tensor(is_virtual)": (
        "tensor 'T': is_virtual",
        lambda f: _relu()[0].tensor(name="T", dims=[2], is_virtual=f),
    ),
}
SDPA_FLAGS = ["causal_mask", "causal_mask_bottom_right", "generate_stats"]


@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
@pytest.mark.parametrize("where", [*TENSOR_FLAGS, *SDPA_FLAGS])
def test_a_flag_refuses_what_is_not_a_bool(where: str, value: Any) -> None:
    if where in SDPA_FLAGS:
        what, call = f"sdpa('attn'): {where}", lambda f: _sdpa(**{where: f})
    else:
        what, call = TENSOR_FLAGS[where]
    with pytest.raises(dt.InvalidTypeError) as caught:
        call(value)
    message = str(caught.value)
    assert message.startswith(f"{what}: expected a bool, got {value!r} ")
    assert "a flag takes a bool only, True or False, not a string or a number" in message
    assert isinstance(caught.value, TypeError)  # a wrong type, as Python's own calls say
    assert isinstance(caught.value, dt.InvalidValueError)  # as every other bad field


@pytest.mark.parametrize(("value", "hint"), [("False", "False"), (" TRUE", "True"), (0, "False")])
def test_the_message_names_the_bool_to_give(value: Any, hint: str) -> None:
    with pytest.raises(dt.InvalidTypeError, match=f"give {hint}$"):
        _relu()[2].set_output(value)


def test_a_refused_set_output_leaves_the_tensor_as_it_was() -> None:
    g, _, y = _relu()
    with pytest.raises(TypeError):
        y.set_output("False")
    assert y.is_virtual is True and y.is_output is False
    with pytest.raises(dt.InvalidValueError, match="is virtual and never read"):
        g.validate()


@pytest.mark.parametrize("flag", [True, False, np.True_, np.False_], ids=repr)
def test_bools_and_numpy_bools_are_taken(flag: Any) -> None:
    _, x, y = _relu()
    y.set_output(flag)
    assert type(y.is_output) is bool and y.is_output == bool(flag)
    assert type(y.is_virtual) is bool and y.is_virtual == (not flag)
    x.is_virtual = flag
    assert type(x.is_virtual) is bool
    attn = _sdpa(causal_mask=flag, generate_stats=flag)
    (node,) = attn.nodes
    assert node.params["causal_mask"] is bool(flag)
    assert node.params["generate_stats"] is bool(flag)
    assert len(node.outputs) == (2 if flag else 1)
    json.dumps(attn.to_dict())  # a NumPy bool kept as given is no JSON
