"""validate(): messages name the node and field (or tensor); structural and type checks."""

from __future__ import annotations

import pytest

import dnntune as dt
from dnntune.graph.ir import TensorError
from dnntune.graph.ops.base import NodeError

F32, F16 = dt.DataType.FLOAT, dt.DataType.HALF


def graph(**kwargs: dt.DataType) -> dt.Graph:
    types = {"io_data_type": F32, "compute_data_type": F32, "intermediate_data_type": F32}
    types.update(kwargs)
    return dt.Graph(name="g", **types)


def chain() -> tuple[dt.Graph, dt.TensorAttributes, dt.TensorAttributes]:
    """x -> relu -> exp -> y."""
    g = graph()
    x = g.tensor("X", [2, 3])
    h = g.pointwise(x, mode=dt.PointwiseMode.RELU_FWD, name="relu")
    y = g.pointwise(h, mode=dt.PointwiseMode.EXP, name="exp")
    y.set_output(True)
    return g, x, y


def test_valid_graph_fills_types_and_is_idempotent() -> None:
    g, x, y = chain()
    g.validate()
    g.validate()
    assert g.is_validated
    assert x.data_type is F32 and y.data_type is F32
    assert [t.name for t in g.io_tensors()] == ["X", "exp::OUT_0"]


def test_virtual_takes_intermediate_type_output_takes_io_type() -> None:
    g = graph(io_data_type=F16)
    x = g.tensor("X", [2, 3])
    h = g.pointwise(x, mode=dt.PointwiseMode.RELU_FWD)
    y = g.pointwise(h, mode=dt.PointwiseMode.EXP)
    y.set_output(True)
    g.validate()
    assert (x.data_type, h.data_type, y.data_type) == (F16, F32, F16)
    y.set_output(False)
    h2 = g.pointwise(y, mode=dt.PointwiseMode.NEG)
    h2.set_output(True)
    g.validate()
    assert y.data_type is F32  # became virtual: re-resolved


def test_empty_graph_and_missing_types() -> None:
    with pytest.raises(dt.InvalidValueError, match=r"has no nodes"):
        dt.Graph(name="empty").validate()
    g = dt.Graph(name="untyped")
    y = g.pointwise(g.tensor("X", [2]), mode=dt.PointwiseMode.EXP)
    y.set_output(True)
    with pytest.raises(TensorError, match=r"tensor 'X' .*has no data type and the graph sets no"):
        g.validate()


# ---- structure ------------------------------------------------------------------------------
def test_duplicate_uid() -> None:
    g, x, y = chain()
    x.set_uid(5)
    y.set_uid(5)
    with pytest.raises(TensorError, match=r"duplicate uid 5, also used by 'X'") as info:
        g.validate()
    assert info.value.tensor is y


def test_cycle_names_a_node() -> None:
    g, x, y = chain()
    g.nodes[0].inputs["in_0_tensor_uid"] = y  # relu now reads exp's output
    g.tensors.remove(x)
    with pytest.raises(NodeError, match=r"node '(relu|exp)' .*cycle"):
        g.validate()


def test_self_loop_is_a_cycle() -> None:
    g = graph()
    x = g.tensor("X", [2])
    y = g.pointwise(x, mode=dt.PointwiseMode.EXP, name="exp")
    g.nodes[0].inputs["in_0_tensor_uid"] = y
    g.tensors.remove(x)
    with pytest.raises(NodeError, match=r"node 'exp' .*cycle"):
        g.validate()


def test_virtual_tensor_never_written() -> None:
    g = graph()
    x = g.tensor("X", [2, 3], is_virtual=True)
    g.pointwise(x, mode=dt.PointwiseMode.EXP).set_output(True)
    with pytest.raises(TensorError, match=r"tensor 'X' .*is virtual but no node writes it"):
        g.validate()


def test_unused_virtual_output_suggests_set_output() -> None:
    g = graph()
    g.pointwise(g.tensor("X", [2]), mode=dt.PointwiseMode.EXP, name="exp")
    with pytest.raises(TensorError, match=r"'exp::OUT_0' .*never read: call set_output\(True\)"):
        g.validate()


def test_two_components() -> None:
    g = graph()
    g.pointwise(g.tensor("A", [2]), mode=dt.PointwiseMode.EXP, name="a").set_output(True)
    g.pointwise(g.tensor("B", [2]), mode=dt.PointwiseMode.EXP, name="b").set_output(True)
    with pytest.raises(dt.InvalidValueError, match=r"2 unconnected parts \[\['a'\], \['b'\]\]"):
        g.validate()


def test_shared_scalar_does_not_connect_components() -> None:
    g = graph()
    eps = g.scalar(1e-5, name="eps")
    g.pointwise(g.tensor("A", [2]), eps, mode=dt.PointwiseMode.ADD).set_output(True)
    g.pointwise(g.tensor("B", [2]), eps, mode=dt.PointwiseMode.ADD).set_output(True)
    with pytest.raises(dt.InvalidValueError, match=r"unconnected parts"):
        g.validate()


def test_unused_tensor() -> None:
    g, _, _ = chain()
    g.tensor("STRAY", [4])
    with pytest.raises(TensorError, match=r"'STRAY' .*is not used by any node"):
        g.validate()


def test_tensor_written_twice() -> None:
    g, _, y = chain()
    g.nodes[0].outputs["out_0_tensor_uid"] = y
    with pytest.raises(NodeError, match=r"node 'exp' .*out_0_tensor_uid: .*already written by"):
        g.validate()


def test_scalar_cannot_be_an_output() -> None:
    g, _, _ = chain()
    s = g.scalar(1.0, name="s")
    g.nodes[1].outputs["out_0_tensor_uid"] = s
    with pytest.raises(NodeError, match=r"out_0_tensor_uid: a pass-by-value scalar cannot be"):
        g.validate()


def test_unknown_and_missing_fields() -> None:
    g, x, _ = chain()
    g.nodes[0].inputs["bogus_tensor_uid"] = x
    with pytest.raises(NodeError, match=r"node 'relu' .*bogus_tensor_uid: unknown input field"):
        g.validate()
    g, _, _ = chain()
    del g.nodes[1].inputs["in_0_tensor_uid"]
    with pytest.raises(NodeError, match=r"node 'exp' .*in_0_tensor_uid: required input missing"):
        g.validate()


# ---- tensors --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda t: t.set_dims([2, -3]), "node 'relu' .*in_0_tensor_uid: tensor 'X' has dims"),
        (lambda t: t.set_dims([2, 0]), "in_0_tensor_uid: tensor 'X' has dims \\[2, 0\\]"),
        (lambda t: t.set_strides([3]), "tensor 'X' .*strides \\[3\\] must have one entry per dim"),
        (lambda t: t.set_strides([3, -1]), "tensor 'X' .*strides \\[3, -1\\] must be >= 0"),
        (lambda t: t.set_dims([]), "in_0_tensor_uid: tensor 'X' has no dims"),
    ],
)
def test_bad_tensor_attributes(change, match: str) -> None:  # type: ignore[no-untyped-def]
    g, x, _ = chain()
    change(x)
    with pytest.raises(dt.InvalidValueError, match=match):
        g.validate()


def test_changing_input_dims_after_build_is_caught() -> None:
    g, x, _ = chain()
    g.validate()
    x.set_dims([4, 3]).set_strides([3, 1])
    with pytest.raises(
        NodeError,
        match=r"node 'relu' .*out_0_tensor_uid: dims \[2, 3\] do not "
        r"match the inferred dims \[4, 3\]",
    ):
        g.validate()
    assert not g.is_validated


def test_output_strides_must_not_overlap() -> None:
    g, x, y = chain()
    y.set_strides([1, 1])
    with pytest.raises(TensorError, match=r"'exp::OUT_0' .*make elements .* overlap"):
        g.validate()
    y.set_strides([1, 2])  # column-major: fine
    g.validate()
    x.set_strides([0, 1])  # a broadcast (stride 0) input is fine
    g.validate()


def test_output_strides_that_do_not_nest_but_hit_distinct_addresses_are_fine() -> None:
    """Dims [2, 3] with strides [3, 2] reach addresses 0, 2, 4, 3, 5, 7: distinct, though the
    strides do not nest; the sufficient test refused them (new-user audit, session 56). They
    are counted exactly; strides [2, 1] over [2, 3] share addresses 2 and 3 and are refused."""
    g, _, y = chain()
    y.set_strides([3, 2])
    g.validate()
    y.set_strides([2, 1])
    with pytest.raises(
        TensorError, match=r"strides \[2, 1\] make elements of dims \[2, 3\] overlap"
    ):
        g.validate()


def test_scalar_checks() -> None:
    g = graph()
    x = g.tensor("X", [2])
    s = g.scalar(2.0, name="two")
    g.pointwise(x, s, mode=dt.PointwiseMode.MUL).set_output(True)
    g.validate()
    s.set_data_type(dt.DataType.INT8)
    with pytest.raises(TensorError, match=r"'two' .*a pass-by-value scalar must be one of"):
        g.validate()
    s.set_data_type(dt.DataType.INT32)
    with pytest.raises(TensorError, match=r"'two' .*an int32 scalar takes an integer, got 2.0"):
        g.validate()  # as the JSON loader refuses an Int32Value of 2.0 (session 58)
    s.value = 2
    g.validate()
    s.set_is_virtual(True)
    with pytest.raises(TensorError, match=r"'two' .*cannot be virtual"):
        g.validate()


# ---- data types -----------------------------------------------------------------------------
def test_conv_needs_floating_point() -> None:
    g = graph()
    x = g.tensor("X", [1, 4, 8, 8], data_type=dt.DataType.INT32)
    g.conv_fprop(x, g.tensor("W", [4, 4, 3, 3]), padding=1, name="conv").set_output(True)
    with pytest.raises(
        NodeError, match=r"node 'conv' .*x_tensor_uid: tensor 'X' must be floating point, got int32"
    ):
        g.validate()


def test_sdpa_mask_type() -> None:
    g = graph()
    q = g.tensor("Q", [1, 2, 4, 8])
    m = g.tensor("M", [1, 1, 4, 4], data_type=dt.DataType.INT32)
    (o,) = g.sdpa(q, q, q, attn_mask=m, name="attn")
    o.set_output(True)
    with pytest.raises(NodeError, match=r"attn_mask_tensor_uid: must be boolean or floating"):
        g.validate()
    m.set_data_type(dt.DataType.BOOLEAN)
    g.validate()


def test_pointwise_on_integers_is_fine() -> None:
    g = graph(io_data_type=dt.DataType.INT32)
    y = g.pointwise(g.tensor("A", [4]), g.tensor("B", [4]), mode=dt.PointwiseMode.ADD)
    y.set_output(True)
    g.validate()


def test_statistics_stay_float32_when_made_outputs() -> None:
    g = graph(io_data_type=F16)
    x = g.tensor("X", [2, 8])
    s = g.tensor("S", [1, 8])
    y, mean, inv = g.layernorm(x, s, s, forward_phase=dt.NormFwdPhase.TRAINING)
    for t in (y, mean, inv):
        t.set_output(True)
    g.validate()
    assert (y.data_type, mean.data_type, inv.data_type) == (F16, F32, F32)


def test_norm_phase_and_outputs_must_agree() -> None:
    g = graph()
    x = g.tensor("X", [2, 8])
    s = g.tensor("S", [1, 8])
    (y,) = g.layernorm(x, s, s, name="ln")
    y.set_output(True)
    g.nodes[0].params["forward_phase"] = dt.NormFwdPhase.TRAINING
    with pytest.raises(NodeError, match=r"node 'ln' .*mean_tensor_uid: training phase needs"):
        g.validate()


@pytest.mark.parametrize(
    ("param", "value", "match"),
    [
        ("dropout_probability", 0.1, "dropout_probability: dropout is not supported"),
        ("alibi_mask", True, "alibi_mask: is not supported"),
        ("left_bound", 16, "left_bound: sliding-window attention is not supported"),
        ("right_bound", 3, "right_bound: only 0 \\(causal\\) is supported"),
        ("generate_stats", True, "stats_tensor_uid: generate_stats is set but no stats output"),
    ],
)
def test_sdpa_unsupported_attributes(param: str, value: object, match: str) -> None:
    g = graph()
    q = g.tensor("Q", [1, 2, 4, 8])
    (o,) = g.sdpa(q, q, q, name="attn")
    o.set_output(True)
    g.nodes[0].params[param] = value
    with pytest.raises(NodeError, match=f"node 'attn' \\(sdpa_fwd\\): {match}"):
        g.validate()


def test_sdpa_causal_band_becomes_causal_flag() -> None:
    from dnntune.graph.ops.sdpa import DiagonalAlignment

    g = graph()
    q = g.tensor("Q", [1, 2, 4, 8])
    (o,) = g.sdpa(q, q, q, name="attn")
    o.set_output(True)
    node = g.nodes[0]
    node.params.update(left_bound=-1, right_bound=0)
    g.validate()
    assert node.params["causal_mask"] is True and node.inferred == {"causal_mask": True}
    node.params.update(causal_mask=False, diagonal_alignment=DiagonalAlignment.BOTTOM_RIGHT)
    node.inferred.clear()
    g.validate()
    assert node.params["causal_mask_bottom_right"] is True
    node.params["causal_mask"] = True
    with pytest.raises(NodeError, match=r"causal_mask_bottom_right: causal_mask and"):
        g.validate()


def test_required_parameter_missing() -> None:
    g, _, _ = chain()
    g.nodes[0].params["operation"] = None
    with pytest.raises(NodeError, match=r"node 'relu' .*operation: required parameter missing"):
        g.validate()


def test_core_node_priority() -> None:
    g = graph()
    x = g.tensor("X", [1, 4, 8, 8])
    y = g.conv_fprop(x, g.tensor("W", [4, 4, 3, 3]), padding=1, name="conv")
    y = g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD, name="relu")
    y.set_output(True)
    assert g.core_node().name == "conv"
    assert [n.name for n in g.topological_nodes()] == ["conv", "relu"]


@pytest.mark.parametrize("eps", [float("nan"), float("inf"), -1e-5])
def test_a_norms_epsilon_must_be_a_finite_number_at_least_zero(eps: float) -> None:
    """A NaN epsilon made every output NaN, which then matched a NaN reference ("PASS")."""
    g = graph()
    x = g.tensor("X", [2, 8])
    scale, bias = g.tensor("scale", [1, 8]), g.tensor("bias", [1, 8])
    (y,) = g.layernorm(x, scale, bias, epsilon=1e-5, name="ln")
    y.set_output(True)
    g.validate()
    ln = g.nodes[0]
    ln.inputs["epsilon_tensor_uid"].value = eps
    with pytest.raises(NodeError, match=r"'ln'.*epsilon_tensor_uid.*must be a finite number >= 0"):
        g.validate()


def test_a_nan_scalar_is_refused() -> None:
    g = graph()
    x = g.tensor("X", [2])
    g.pointwise(x, g.scalar(float("nan"), name="c"), mode=dt.PointwiseMode.MUL).set_output(True)
    with pytest.raises(TensorError, match=r"'c' .*a pass-by-value scalar is NaN"):
        g.validate()


@pytest.mark.parametrize("compute", [dt.DataType.INT8, dt.DataType.BOOLEAN, dt.DataType.UINT8])
def test_a_compute_type_no_op_computes_in_is_refused(compute: dt.DataType) -> None:
    """A float matmul with an int8 or boolean compute type validated and then ran in fp32."""
    g = graph(compute_data_type=compute)
    a, b = g.tensor("A", [1, 4, 8]), g.tensor("B", [1, 8, 2])
    g.matmul(a, b).set_output(True)
    with pytest.raises(dt.InvalidValueError, match=r"is not a type to compute in"):
        g.validate()
    g.compute_data_type = dt.DataType.FLOAT
    g.validate()
