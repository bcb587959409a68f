"""Graph.execute's bound fast path checks every tensor's dtype, dims, strides and device type
in one comparison (issue 22): anything that differs from the bound layout takes the full
check, which runs it or names what is wrong."""

from __future__ import annotations

import pytest
import torch

import dnntune as dt
from dnntune import reference


def _graph(n_inputs: int) -> tuple[dt.Graph, dt.Handle]:
    """relu(X) (one input) or relu(X + B) (two), output uid 12."""
    handle = dt.create_handle("cpu")
    g = dt.Graph("bind", io_data_type=dt.DataType.FLOAT, intermediate_data_type=dt.DataType.FLOAT)
    y = g.tensor("X", [4, 6], uid=10)
    if n_inputs == 2:
        y = g.pointwise(y, g.tensor("B", [1, 6], uid=11), mode=dt.PointwiseMode.ADD)
    g.pointwise(y, mode=dt.PointwiseMode.RELU_FWD).set_output(True).set_name("Y").set_uid(12)
    g.build(handle)
    return g, handle


def _check(g: dt.Graph, pack: dict[int, torch.Tensor]) -> None:
    inputs = {u: t for u, t in pack.items() if u != 12}
    torch.testing.assert_close(pack[12], reference.run(g, inputs)[12].float())


@pytest.fixture(params=["pytorch's tensor guards", "python comparison"])
def check_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the bound path checks a pack: PyTorch's C++ tensor guards, and the generated
    Python comparison (a PyTorch without them)."""
    from dnntune.backend import tensor_guards

    if request.param == "python comparison":
        monkeypatch.setattr(tensor_guards, "guards_class", lambda: None)
    else:
        assert tensor_guards.guards_class() is not None, "this PyTorch has TensorGuards"
    return str(request.param)


@pytest.mark.parametrize("n_inputs", [1, 2])
def test_each_difference_takes_the_full_check(n_inputs: int, check_kind: str) -> None:
    g, handle = _graph(n_inputs)
    pack = reference.make_inputs(g, seed=1)
    g.execute(handle, pack)
    binding = g._binding
    assert binding is not None and binding.tensors(pack) is not None
    _check(g, pack)
    # another stride of a size-1 dim: the full check accepts it, the binding does not
    wide = torch.empty(4, 12)[:, :6]  # strides (12, 1): not the bound (6, 1)
    wide.copy_(pack[10])
    other = {**pack, 10: wide}
    assert binding.tensors(other) is None
    with pytest.raises(dt.InvalidValueError, match="uid 10"):
        g.execute(handle, other)  # a non-dense layout the graph does not declare
    for bad in (pack[10].double(), torch.zeros(4, 7)):  # dtype, dims
        wrong = {**pack, 10: bad}
        assert binding.tensors(wrong) is None
        with pytest.raises(dt.InvalidValueError, match="uid 10"):
            g.execute(handle, wrong)
    on_meta = {**pack, 10: pack[10].to("meta")}  # another device type
    assert binding.tensors(on_meta) is None
    with pytest.raises(dt.DnnTuneError, match="meta"):
        g.execute(handle, on_meta)
    assert binding.tensors({**pack, 10: pack[10].numpy()}) is None  # converted by the full path
    assert binding.tensors({k: v for k, v in pack.items() if k != 10}) is None  # a missing key
    fresh = reference.make_inputs(g, seed=2)
    g.execute(handle, fresh)  # new buffers of the bound layout: the fast path, right results
    assert g._binding is binding
    _check(g, fresh)


def test_the_guards_also_send_other_autograd_and_view_kinds_to_the_full_check(
    check_kind: str,
) -> None:
    """With PyTorch's tensor guards a tensor that wants gradients takes the full path (which
    runs it and binds again); a lazy negative view takes it with either check, and the full
    check refuses it by name (an engine reading its memory would read the values before the
    negation; audit, session 18)."""
    g, handle = _graph(2)
    pack = reference.make_inputs(g, seed=1)
    g.execute(handle, pack)
    binding = g._binding
    assert binding is not None
    wants_grad = {**pack, 10: pack[10].clone().requires_grad_(True)}
    negative = {**pack, 10: (-pack[10])._neg_view()}
    guarded = check_kind == "pytorch's tensor guards"
    assert (binding.tensors(wants_grad) is None) == guarded
    assert binding.tensors(negative) is None
    with torch.no_grad(), pytest.raises(dt.InvalidValueError, match="lazy negative"):
        g.execute(handle, negative)
    resolved = {**negative, 10: negative[10].resolve_neg()}
    g.execute(handle, resolved)
    _check(g, resolved)


class _OnGpu:
    """A tensor's look as the bound check reads it, on CUDA device ``index``."""

    def __init__(self, index: int) -> None:
        self.dtype, self.shape, self.is_cuda, self.index = (
            torch.float32,
            torch.Size([4, 6]),
            True,
            index,
        )

    def stride(self) -> tuple[int, ...]:
        return (6, 1)

    def get_device(self) -> int:
        return self.index

    def is_neg(self) -> bool:
        return False


def test_the_python_check_compares_the_cuda_device_index() -> None:
    """The generated comparison of a CUDA binding reads each tensor's device index: a buffer
    on another GPU (the same dtype, dims and strides) is not bound to cuda:0's plan (the full
    check then names it)."""
    from dnntune.backend.pack_binding import _generated

    layout = [(torch.float32, torch.Size([4, 6]), (6, 1), True)]
    check = _generated([10], layout, "is_cuda", None, (), None, device_index=0)[0]
    same, other = {10: _OnGpu(0)}, {10: _OnGpu(1)}
    assert check(same) is not None
    assert check(other) is None


def test_the_full_check_places_tensors_by_device_and_index() -> None:
    from dnntune.backend.variant_pack import _placed, handle_place

    handle = dt.create_handle("cpu")
    assert handle_place(handle) == -1 and handle_place(None) is None
    assert _placed(torch.zeros(1), -1)
    assert not _placed(torch.zeros(1, device="meta"), -1)  # neither CPU nor CUDA memory
    assert not _placed(torch.zeros(1), 0)
    assert _placed(_OnGpu(1), 1) and not _placed(_OnGpu(1), 0)


@pytest.mark.gpu
def test_a_pack_on_another_gpu_is_refused() -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    handle = dt.create_handle("cuda:0")
    g = dt.Graph("two_gpus", io_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [4, 6], uid=10)
    g.pointwise(x, mode=dt.PointwiseMode.RELU_FWD).set_output(True).set_uid(12)
    g.build(handle)
    pack = {10: torch.randn(4, 6, device="cuda:0"), 12: torch.empty(4, 6, device="cuda:0")}
    g.execute(handle, pack)
    g.execute(handle, pack)  # bound
    other = {u: t.to("cuda:1") for u, t in pack.items()}
    with pytest.raises(dt.InvalidValueError, match="cuda:1"):
        g.execute(handle, other)
