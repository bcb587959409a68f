"""The native memo: a signature whose winner is PyTorch's own op skips the kernel lookup."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dnntune.torch as dtt
from dnntune.torch import functional, norms, pooling, runtime


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the kernel lookups the functional ops make (kernel_for calls)."""
    seen: list[str] = []
    real = functional.kernel_for

    def spy(key, make_graph, inputs):  # type: ignore[no-untyped-def]
        seen.append(key[0])
        return real(key, make_graph, inputs)

    monkeypatch.setattr(functional, "kernel_for", spy)
    monkeypatch.setattr(norms, "kernel_for", spy)
    monkeypatch.setattr(pooling, "kernel_for", spy)
    monkeypatch.setattr("dnntune.torch.autograd.kernel_for", spy)
    return seen


def _force_native(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(runtime.Kernel, "native", property(lambda self: native))


def test_a_native_signature_is_looked_up_once(
    lookups: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _force_native(monkeypatch, True)
    x, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    for _ in range(3):
        torch.testing.assert_close(dtt.linear(x, w, b), F.linear(x, w, b))
        dtt.layer_norm(x, (16,))
        dtt.rms_norm(x, (16,), eps=1e-6)
    assert lookups == ["linear", "layer_norm", "rms_norm"]
    dtt.linear(torch.randn(5, 16), w, b)  # another shape: another signature
    assert lookups[-1] == "linear" and len(lookups) == 4


def test_a_dnntune_kernel_is_looked_up_once_and_then_called_directly(
    lookups: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _force_native(monkeypatch, False)
    x, w = torch.randn(4, 16), torch.randn(8, 16)
    for _ in range(3):
        torch.testing.assert_close(dtt.linear(x, w), F.linear(x, w))
    assert lookups == ["linear"]  # later calls run the signature's prepared call
    with torch.enable_grad():  # gradients wanted: another signature, looked up every call
        wg = w.clone().requires_grad_()
        dtt.linear(x, wg).sum().backward()
        dtt.linear(x, wg)
    assert lookups[1:].count("linear") >= 2


def test_configure_and_clear_and_attribution_start_afresh(
    lookups: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _force_native(monkeypatch, True)
    x = torch.randn(2, 3, 8, 8)
    w = torch.randn(4, 3, 3, 3)
    dtt.conv2d(x, w, padding=1)
    dtt.conv2d(x, w, padding=1)
    assert lookups == ["conv2d"]
    dtt.configure(policy="cached")  # another config: decisions may differ
    dtt.conv2d(x, w, padding=1)
    runtime.cache().clear()
    dtt.conv2d(x, w, padding=1)
    with runtime.using_module("block"):  # optimize() attributing kernels to modules
        dtt.conv2d(x, w, padding=1)
    assert lookups == ["conv2d"] * 4
    assert runtime.module_plans.get("block")
