"""The reference against independent computations: layer/RMS/batch norms and attention."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from dnntune import reference as ref
from dnntune.graph import DataType, GraphBuilder, NormFwdPhase, TensorAttributes

F64 = torch.float64


def uid(t: TensorAttributes) -> int:
    """The tensor's uid (assigned once the graph is validated)."""
    assert t.uid is not None
    return t.uid


def _graph(io: DataType = DataType.FLOAT) -> GraphBuilder:
    return GraphBuilder(
        name="g",
        io_data_type=io,
        compute_data_type=DataType.FLOAT,
        intermediate_data_type=DataType.FLOAT,
    )


def _np(pack: dict[int, torch.Tensor], t: TensorAttributes) -> np.ndarray:
    assert t.uid is not None
    return pack[uid(t)].to(F64).numpy()


def _out(out: dict[int, torch.Tensor], t: TensorAttributes) -> np.ndarray:
    assert t.uid is not None
    assert list(out[uid(t)].shape) == t.dims
    return out[uid(t)].numpy()


def _run(g: GraphBuilder, seed: int = 0) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    g.validate()
    pack = ref.make_inputs(g, seed=seed)
    return pack, ref.run(g, pack)


# ---- layer norm and RMS norm ------------------------------------------------------------------
@pytest.mark.parametrize("count", [None, 1])
@pytest.mark.parametrize("phase", list(NormFwdPhase), ids=lambda p: p.json_name)
def test_layernorm_matches_numpy(count: int | None, phase: NormFwdPhase) -> None:
    g = _graph()
    x = g.tensor("x", [2, 3, 4])
    norm_dims = [1, 3, 4] if count is None else [1, 1, 4]
    scale, bias = g.tensor("scale", norm_dims), g.tensor("bias", norm_dims)
    outs = g.layernorm(x, scale, bias, 1e-3, forward_phase=phase, normalized_dim_count=count)
    for t in outs:
        t.set_output(True)
    pack, out = _run(g)
    xs = _np(pack, x)
    axes = (1, 2) if count is None else (2,)
    mean = xs.mean(axis=axes, keepdims=True)
    var = ((xs - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + 1e-3)
    expected = (xs - mean) * inv * _np(pack, scale) + _np(pack, bias)
    np.testing.assert_allclose(_out(out, outs[0]), expected, rtol=1e-12, atol=1e-12)
    if phase is NormFwdPhase.TRAINING:
        np.testing.assert_allclose(_out(out, outs[1]), mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(_out(out, outs[2]), inv, rtol=1e-12)
    else:
        assert len(outs) == 1


@pytest.mark.parametrize("with_bias", [False, True])
def test_rmsnorm_matches_numpy_with_training_stats(with_bias: bool) -> None:
    g = _graph()
    x = g.tensor("x", [3, 2, 8])
    scale = g.tensor("scale", [1, 1, 8])
    bias = g.tensor("bias", [1, 1, 8]) if with_bias else None
    y, inv_rms = g.rmsnorm(
        x, scale, 1e-5, bias, forward_phase=NormFwdPhase.TRAINING, normalized_dim_count=1
    )
    y.set_output(True)
    inv_rms.set_output(True)
    pack, out = _run(g)
    xs = _np(pack, x)
    inv = 1.0 / np.sqrt((xs**2).mean(axis=2, keepdims=True) + 1e-5)
    expected = xs * inv * _np(pack, scale) + (_np(pack, bias) if bias is not None else 0.0)
    np.testing.assert_allclose(_out(out, y), expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(_out(out, inv_rms), inv, rtol=1e-12)
    assert inv_rms.dims == [3, 2, 1] and inv_rms.data_type is DataType.FLOAT


# ---- batch norm -------------------------------------------------------------------------------
def _channel(n: int) -> list[int]:
    return [1, n, 1, 1]


def test_batchnorm_training_matches_formulas_and_torch_running_stats() -> None:
    g = _graph()
    x = g.tensor("x", [4, 3, 5, 5])
    scale, bias = g.tensor("scale", _channel(3)), g.tensor("bias", _channel(3))
    rmean, rvar = g.tensor("rmean", _channel(3)), g.tensor("rvar", _channel(3))
    outs = g.batchnorm(
        x, scale, bias, 1e-5, prev_running_mean=rmean, prev_running_variance=rvar, momentum=0.1
    )
    for t in outs:
        t.set_output(True)
    y, mean, inv_var, next_mean, next_var = outs
    pack, out = _run(g)
    xs = _np(pack, x)
    m = xs.mean(axis=(0, 2, 3), keepdims=True)
    v = ((xs - m) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    inv = 1.0 / np.sqrt(v + 1e-5)
    np.testing.assert_allclose(
        _out(out, y), (xs - m) * inv * _np(pack, scale) + _np(pack, bias), rtol=1e-12, atol=1e-13
    )
    np.testing.assert_allclose(_out(out, mean), m, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(_out(out, inv_var), inv, rtol=1e-12)
    # Running statistics as torch computes them (unbiased variance, momentum 0.1).
    run_mean = pack[uid(rmean)].to(F64).flatten().clone()
    run_var = pack[uid(rvar)].to(F64).flatten().clone()
    torch.nn.functional.batch_norm(
        torch.from_numpy(xs), run_mean, run_var, training=True, momentum=0.1, eps=1e-5
    )
    np.testing.assert_allclose(_out(out, next_mean).flatten(), run_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(_out(out, next_var).flatten(), run_var.numpy(), rtol=1e-12)


def test_batchnorm_inference_matches_formula() -> None:
    g = _graph()
    x = g.tensor("x", [2, 4, 3, 3])
    per = [g.tensor(n, _channel(4)) for n in ("mean", "inv_var", "scale", "bias")]
    y = g.batchnorm_inference(x, *per).set_output(True)
    pack, out = _run(g)
    mean, inv, scale, bias = (_np(pack, t) for t in per)
    assert (inv > 0).all()
    np.testing.assert_allclose(
        _out(out, y), (_np(pack, x) - mean) * inv * scale + bias, rtol=1e-12, atol=1e-14
    )


def test_batchnorm_backward_matches_autograd() -> None:
    g = _graph()
    x = g.tensor("x", [3, 2, 4, 5])
    dy = g.tensor("dy", [3, 2, 4, 5])
    mean, inv_var, scale = (g.tensor(n, _channel(2)) for n in ("mean", "inv_var", "scale"))
    dx, dscale, dbias = g.batchnorm_backward(dy, x, mean, inv_var, scale)
    for t in (dx, dscale, dbias):
        t.set_output(True)
    g.validate()
    pack = ref.make_inputs(g, seed=2)
    # Saved statistics that belong to x, as a training forward pass leaves them.
    xt = pack[uid(x)].to(F64).requires_grad_(True)
    st = pack[uid(scale)].to(F64).requires_grad_(True)
    bt = torch.zeros(1, 2, 1, 1, dtype=F64, requires_grad=True)
    m = xt.mean(dim=(0, 2, 3), keepdim=True)
    inv = torch.rsqrt(((xt - m) ** 2).mean(dim=(0, 2, 3), keepdim=True) + 1e-5)
    pack[uid(mean)] = m.detach().float()
    pack[uid(inv_var)] = inv.detach().float()
    ((xt - m) * inv * st + bt).backward(pack[uid(dy)].to(F64))
    out = ref.run(g, pack)
    # mean/inv_var went through float32; the gradients follow them to about 1e-6.
    assert xt.grad is not None and st.grad is not None and bt.grad is not None
    np.testing.assert_allclose(_out(out, dx), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_out(out, dscale), st.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_out(out, dbias), bt.grad.numpy(), rtol=1e-12, atol=1e-12)


# ---- attention --------------------------------------------------------------------------------
def _sdpa_loops(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    causal: bool,
    bottom_right: bool,
    mask: np.ndarray | None,
    mask_bool: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Attention one row at a time, with every mask rule spelled out."""
    b, h, sq, _ = q.shape
    hk, skv, dv = k.shape[1], k.shape[2], v.shape[3]
    o = np.zeros((b, h, sq, dv))
    lse = np.zeros((b, h, sq, 1))
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hk)
            for i in range(sq):
                scores = []
                for j in range(skv):
                    s = float(np.dot(q[bi, hi, i], k[bi, kv, j])) * scale
                    keep = True
                    if causal and j > i:
                        keep = False
                    if bottom_right and j > i + (skv - sq):
                        keep = False
                    if mask is not None:
                        mv = mask[bi % mask.shape[0], hi % mask.shape[1], i, j]
                        if mask_bool:
                            keep = keep and bool(mv)
                        else:
                            s += mv
                    scores.append(s if keep else -math.inf)
                finite = [s for s in scores if s != -math.inf]
                if not finite:
                    lse[bi, hi, i, 0] = -math.inf
                    continue
                mx = max(finite)
                weights = [math.exp(s - mx) if s != -math.inf else 0.0 for s in scores]
                total = sum(weights)
                lse[bi, hi, i, 0] = mx + math.log(total)
                o[bi, hi, i] = sum(wj / total * v[bi, kv, j] for j, wj in enumerate(weights))
    return o, lse


SDPA_CASES: dict[str, dict[str, Any]] = {
    "plain": dict(q=[1, 2, 3, 4], kv=[1, 2, 5, 4]),
    "causal_top_left": dict(q=[2, 2, 3, 4], kv=[2, 2, 5, 4], causal=True),
    "causal_bottom_right": dict(q=[1, 2, 3, 4], kv=[1, 2, 5, 4], bottom_right=True),
    "bottom_right_sq_gt_skv": dict(q=[1, 1, 5, 4], kv=[1, 1, 3, 4], bottom_right=True),
    "causal_top_left_sq_gt_skv": dict(q=[1, 1, 5, 4], kv=[1, 1, 3, 4], causal=True),
    "gqa_scale_dv": dict(q=[1, 4, 3, 4], kv=[1, 2, 6, 4], dv=3, scale=0.3),
    "float_mask": dict(q=[2, 2, 3, 4], kv=[2, 2, 4, 4], mask=[1, 1, 3, 4]),
    "bool_mask_causal": dict(
        q=[2, 4, 4, 4], kv=[2, 2, 4, 4], mask=[2, 1, 4, 4], bool_mask=True, causal=True
    ),
}


@pytest.mark.parametrize("name", list(SDPA_CASES))
def test_sdpa_matches_explicit_loops(name: str) -> None:
    case = SDPA_CASES[name]
    g = _graph()
    kvd = case["kv"]
    q = g.tensor("q", case["q"])
    k = g.tensor("k", kvd)
    v = g.tensor("v", [*kvd[:3], case.get("dv", kvd[3])])
    mask = None
    if "mask" in case:
        mask = g.tensor(
            "mask",
            case["mask"],
            data_type=DataType.BOOLEAN if case.get("bool_mask") else DataType.FLOAT,
        )
    o, stats = g.sdpa(
        q,
        k,
        v,
        attn_mask=mask,
        causal_mask=case.get("causal", False),
        causal_mask_bottom_right=case.get("bottom_right", False),
        attn_scale=case.get("scale"),
        generate_stats=True,
    )
    o.set_output(True)
    stats.set_output(True)
    pack, out = _run(g, seed=11)
    scale = case.get("scale") or 1.0 / math.sqrt(case["q"][3])
    expected_o, expected_lse = _sdpa_loops(
        _np(pack, q),
        _np(pack, k),
        _np(pack, v),
        scale,
        case.get("causal", False),
        case.get("bottom_right", False),
        None if mask is None else _np(pack, mask),
        bool(case.get("bool_mask")),
    )
    np.testing.assert_allclose(_out(out, o), expected_o, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(_out(out, stats), expected_lse, rtol=1e-12)
    assert not np.isnan(_out(out, o)).any()


def test_sdpa_fully_masked_rows_give_zero_and_minus_inf_stats() -> None:
    g = _graph()
    q, k, v = g.tensor("q", [1, 1, 4, 2]), g.tensor("k", [1, 1, 2, 2]), g.tensor("v", [1, 1, 2, 2])
    o, stats = g.sdpa(q, k, v, causal_mask_bottom_right=True, generate_stats=True)
    o.set_output(True)
    stats.set_output(True)
    _, out = _run(g)
    # Sq=4, Skv=2 bottom-right: rows 0 and 1 see no key.
    assert (_out(out, o)[0, 0, :2] == 0).all()
    assert np.isneginf(_out(out, stats)[0, 0, :2, 0]).all()
    assert np.isfinite(_out(out, stats)[0, 0, 2:, 0]).all()


def test_sdpa_query_blocks_give_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    import dnntune._reference_ops as ops

    g = _graph()
    q, k, v = g.tensor("q", [1, 2, 7, 4]), g.tensor("k", [1, 2, 5, 4]), g.tensor("v", [1, 2, 5, 4])
    o = g.sdpa(q, k, v, causal_mask=True)[0].set_output(True)
    pack, whole = _run(g)
    monkeypatch.setattr(ops, "_SDPA_SCORE_BUDGET", 2 * 5 * 2)  # two query rows per block
    blocked = ref.run(g, pack)
    np.testing.assert_array_equal(_out(blocked, o), _out(whole, o))


def test_causal_aligned_bottom_right_runs_bottom_right_on_the_torch_engine() -> None:
    """``causal_mask`` with ``diagonal_alignment`` BOTTOM_RIGHT (no right bound) is bottom-right
    for the reference and the cuDNN lowering; the torch engine read the enum's str() and ran it
    top-left, a mismatch whenever the query and key lengths differ (a fifth audit, session 12)."""
    import json
    from pathlib import Path

    import dnntune as dt

    source = Path(__file__).parent.parent / "examples" / "graphs" / "llama3_gqa_sdpa_causal.json"
    doc = json.loads(source.read_text())
    for t in doc["tensors"]:  # 8 queries over 12 keys: the two alignments differ
        b, h, _, d = t["dims"]
        s = 12 if t["name"] in ("K", "V") else 8
        t["dims"], t["strides"] = [b, h, s, d], [h * s * d, s * d, d, 1]
    doc["nodes"][0]["attributes"].update(causal_mask=True, diagonal_alignment="BOTTOM_RIGHT")
    g = dt.Graph.from_json(json.dumps(doc))
    handle = dt.create_handle("cpu")
    g.build_operation_graph(handle)
    g.create_execution_plan_ext("TORCH_ENGINE")
    g.check_support()
    g.build_plans()
    pack = ref.make_inputs(g, "cpu")
    g.execute(handle, pack)
    expected = ref.run(g, pack)
    (out,) = g.output_tensors()
    assert out.uid is not None
    cmp = ref.compare(pack[out.uid], expected[out.uid], ref.tolerance_for(g, out))
    assert cmp.ok, cmp.message
