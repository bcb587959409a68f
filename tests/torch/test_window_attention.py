"""torchvision's Swin window attention on dnntune (``_window_attention``): recognised only as
the library's own class and function, the same answer as its forward (shifted or not, padded
maps, the shift torchvision turns off in the module's own list), its own forward where this one
would differ (dropout, gradients, hooks on the children), and the shift mask kept per size.
CI has no torchvision: ``_torchvision_swin`` stands in for it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from _torchvision_swin import ShiftedWindowAttention, SwinBlock, as_torchvision
from torch import nn
from torch_models import kernel_plan

import dnntune.torch as dtt
from dnntune.torch import _window_attention, runtime
from dnntune.torch._swap_classes import swap_class
from dnntune.torch._window_attention import window_attention_like


def _attention(shift: list[int], window: list[int] | None = None) -> ShiftedWindowAttention:
    torch.manual_seed(0)
    return ShiftedWindowAttention(16, window or [4, 4], shift, num_heads=2).eval()


def _swapped(module: nn.Module) -> nn.Module:
    target = swap_class(module)
    assert target is not None
    module.__class__ = target
    return module


def test_only_torchvisions_own_class_and_function_are_recognised() -> None:
    attention = _attention([2, 2])
    assert not window_attention_like(attention)  # torchvision not imported: its function unknown
    with as_torchvision() as library:
        assert window_attention_like(attention)

        class Mine(ShiftedWindowAttention):
            pass

        assert not window_attention_like(Mine(16, [4, 4], [2, 2], 2))
        patched = _attention([2, 2])
        patched.forward = lambda x: x  # type: ignore[method-assign]
        assert not window_attention_like(patched)
        own = library.shifted_window_attention
        library.shifted_window_attention = lambda *a, **k: None
        assert not window_attention_like(attention)  # the function replaced: not the library's
        library.shifted_window_attention = own
        attention.proj = nn.Identity()  # type: ignore[assignment]
        assert not window_attention_like(attention)


@pytest.mark.parametrize(
    ("size", "shift"),
    [
        ((8, 8), [2, 2]),  # shifted
        ((8, 8), [0, 0]),  # not shifted: the bias alone
        ((6, 10), [2, 2]),  # padded to whole windows
        ((4, 12), [2, 2]),  # one window high: torchvision turns the height's shift off
        ((3, 3), [2, 2]),  # one window, padded: no shift at all
    ],
)
@pytest.mark.parametrize("kernel_path", [False, True])
def test_the_same_answer_as_torchvisions_forward(
    size: tuple[int, int], shift: list[int], kernel_path: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernel_path:
        monkeypatch.setattr(runtime, "_heuristic", kernel_plan)
    with as_torchvision():
        ref = _attention(list(shift))
        mine = _swapped(copy.deepcopy(ref))
        calls = _count_calls(monkeypatch)
        x = torch.randn(3, *size, 16)
        with torch.no_grad():
            want, got = ref(x), mine(x)
        assert calls == [1]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert got.shape == want.shape and got.is_contiguous()
        assert mine.shift_size == ref.shift_size  # the same list, changed the same way


def test_a_library_that_copies_the_shift_list_keeps_the_modules_own() -> None:
    """torchvision 0.28 turns a shift off in a copy of the module's list, earlier versions in
    the list itself: the stand-in does as the installed function does."""
    with as_torchvision() as library:
        mutating = library.shifted_window_attention

        def copying(*args: Any, shift_size: list[int], **kwargs: Any) -> torch.Tensor:
            shift_size = shift_size.copy()
            return mutating(*args, shift_size=shift_size, **kwargs)

        copying.__module__ = library.__name__
        library.shifted_window_attention = copying
        ref = _attention([2, 2])
        mine = _swapped(copy.deepcopy(ref))
        x = torch.randn(1, 4, 12, 16)  # one window high: the height's shift turned off
        with torch.no_grad():
            torch.testing.assert_close(mine(x), ref(x), atol=1e-5, rtol=1e-5)
        assert ref.shift_size == mine.shift_size == [2, 2]
        x = torch.randn(1, 8, 12, 16)  # then a taller map: shifted both ways, in both
        with torch.no_grad():
            torch.testing.assert_close(mine(x), ref(x), atol=1e-5, rtol=1e-5)


def test_the_shift_mask_is_made_once_per_size(monkeypatch: pytest.MonkeyPatch) -> None:
    with as_torchvision():
        mine = _swapped(_attention([2, 2]))
        made = []
        real = _window_attention._regions_apart
        monkeypatch.setattr(
            _window_attention, "_regions_apart", lambda *a: made.append(a) or real(*a)
        )
        with torch.no_grad():
            for size in ((8, 8), (8, 8), (12, 8), (8, 8)):
                mine(torch.randn(2, *size, 16))
        assert len(made) == 2
        kept = mine.__dict__["_dnntune_window_masks"]
        assert len(kept) == 2 and all(m.shape[1] == 1 for (m,) in kept.values())
        # a map of whole windows is rolled and cut into windows by one gather, its pixel
        # order kept per size too; a padded one takes torchvision's pad, roll and views
        orders = mine.__dict__["_dnntune_window_orders"]
        assert sorted(k[0] for k in orders) == [(8, 8), (12, 8)]
        with torch.no_grad():
            mine(torch.randn(1, 6, 10, 16))
        assert len(orders) == 2 and len(kept) == 3


def test_its_own_forward_runs_where_this_one_would_differ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with as_torchvision():
        x = torch.randn(2, 8, 8, 16)
        ref = _attention([2, 2])
        # a dropout: torchvision's F.dropout drops in eval mode too; the same draws either way
        ref.attention_dropout = 0.5
        mine = _swapped(copy.deepcopy(ref))
        calls = _count_calls(monkeypatch)
        with torch.no_grad():
            torch.manual_seed(3)
            want = ref(x)
            torch.manual_seed(3)
            got = mine(x)
        torch.testing.assert_close(got, want)
        assert calls == [0]
        # gradients wanted: its own forward, and the same gradients
        ref.attention_dropout = mine.attention_dropout = 0.0
        ref(x).sum().backward()
        mine(x).sum().backward()
        assert calls == [0]
        for a, b in zip(ref.parameters(), mine.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad)
        # under autocast: its own forward (torchvision's adds promote to the bias's type)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            torch.testing.assert_close(mine(x), ref(x))
        assert calls == [0]
        # a hook on a child torchvision's forward never calls: not called here either
        seen: list[Any] = []
        mine.qkv.register_forward_hook(lambda *a: seen.append(a))
        with torch.no_grad():
            torch.testing.assert_close(mine(x), ref(x), atol=1e-5, rtol=1e-5)
        assert not seen and calls == [0]


def test_optimize_runs_a_swin_block_on_dnntune(tmp_path: Path) -> None:
    with as_torchvision():
        torch.manual_seed(0)
        ref = nn.Sequential(
            SwinBlock(16, 2, [4, 4], [0, 0]), SwinBlock(16, 2, [4, 4], [2, 2])
        ).eval()
        model = copy.deepcopy(ref)
        x = torch.randn(2, 8, 8, 16)
        report = dtt.optimize(
            model,
            (x,),
            policy="heuristic",
            overrides=tmp_path / "ov.json",
            check_speed=False,
        )
        text = str(report)
        assert "0.attn: ShiftedWindowAttention" in text and "1.attn.qkv: Linear" in text
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)
            x2 = torch.randn(1, 12, 8, 16)  # another size: another mask
            torch.testing.assert_close(model(x2), ref(x2), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_recorded_swin_block_replays_eagers_answer(tmp_path: Path) -> None:
    """In bfloat16 on the GPU, replayed: the shift mask is kept from the uncaptured warm-up
    (never made inside the capture), and replays give eager's values."""
    with as_torchvision():
        torch.manual_seed(0)
        ref = (
            nn.Sequential(SwinBlock(64, 2, [7, 7], [0, 0]), SwinBlock(64, 2, [7, 7], [3, 3]))
            .cuda()
            .to(torch.bfloat16)
            .eval()
        )
        model = copy.deepcopy(ref)
        x = torch.randn(4, 14, 14, 64, device="cuda", dtype=torch.bfloat16)
        dtt.optimize(model, (x,), overrides=tmp_path / "ov.json", cuda_graph=True)
        with torch.no_grad():
            want = ref(x)
            for _ in range(3):
                torch.testing.assert_close(model(x), want, atol=6e-2, rtol=6e-2)
        kept = model[1].attn.__dict__["_dnntune_window_masks"]
        assert len(kept) == 1 and next(iter(kept.values()))[0].is_cuda


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the dnntune path ran (a one-item list, counted up)."""
    calls = [0]
    real = _window_attention._window_attention

    def counted(module: Any, x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return real(module, x)

    monkeypatch.setattr(_window_attention, "_window_attention", counted)
    return calls


def test_torchvisions_swin_t_where_it_is_installed(tmp_path: Path) -> None:
    """The real library (not in CI): swin_t's blocks recognised, and optimize's forward gives
    eager's answer, also where the last stage's map is smaller than a window."""
    try:
        from torchvision.models import swin_t
    except Exception as exc:  # not installed, or built for another torch
        pytest.skip(f"torchvision not usable here ({type(exc).__name__})")
    torch.manual_seed(0)
    ref = swin_t().eval()
    assert all(
        window_attention_like(m) for m in ref.modules() if type(m).__name__.startswith("Shifted")
    )
    model = copy.deepcopy(ref)
    x = torch.randn(1, 3, 64, 64)
    report = dtt.optimize(
        model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", check_speed=False
    )
    assert "features.1.1.attn: ShiftedWindowAttention" in str(report)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), atol=1e-4, rtol=1e-4)
    shifts = [(m.shift_size, n) for n, m in ref.named_modules() if hasattr(m, "shift_size")]
    assert shifts == [
        (m.shift_size, n) for n, m in model.named_modules() if hasattr(m, "shift_size")
    ]
