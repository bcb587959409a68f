"""Saving an optimized model whole: ``torch.save(model)`` and ``pickle`` give back PyTorch's model.

``optimize`` swaps module classes for dnntune's (some made at run time); each such class pickles
as the class it stands in for, without dnntune's runtime state (``_subclass.StandIn``). Before
this, ``torch.save(model)`` raised "Can't pickle <class '...Sequential'>: it's not the same
object as torch.nn.modules.container.Sequential".
"""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_models import SequentialBottleneck, VitBlock, randomize_batch_norms

import dnntune.torch as dtt
from dnntune.torch.cuda_graphs import graphs_of
from dnntune.torch.modules import SWAPS

#: the loaded model runs PyTorch's ops where the optimized one ran dnntune's (a folded batch
#: norm, TORCH_ENGINE's graphs): float32 rounding apart, well inside this
ATOL = RTOL = 1e-4


class _TransformerBlock(nn.Module):
    """Pre-norm attention and MLP with residual adds: LayerNorm, Linear + GELU (fused by the
    trace), a Linear residual add in the GEMM's epilogue, and SDPA routed to dnntune."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (x.shape[0], x.shape[1], self.heads, -1)
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.transpose(1, 2).flatten(2))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class _TorchvisionBlock(nn.Module):
    """torchvision's block shape: conv/bn attributes, ``out += identity``, ``self.relu``."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


class _AttentionOnly(nn.Module):
    """No layer to swap: only the root's class changes (its forward routes SDPA to dnntune)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q) * self.scale


def _conv_bn_relu() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 6 * 6, 4),
        nn.GELU(),
    )


def _linear_gelu() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.SiLU())


def _nested() -> nn.Module:
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()),
        SequentialBottleneck(),
        _TorchvisionBlock(),
        nn.Sequential(nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)), nn.ReLU()),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Sequential(nn.Linear(8, 4), nn.Tanh()),
    )


#: (name, model, example input): each exercises other class swaps
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor]]] = {
    "conv_bn_relu": (_conv_bn_relu, lambda: torch.randn(2, 3, 8, 8)),
    "linear_gelu": (_linear_gelu, lambda: torch.randn(3, 16)),
    "transformer_block": (_TransformerBlock, lambda: torch.randn(2, 5, 16)),
    "nested_sequentials": (_nested, lambda: torch.randn(2, 3, 8, 8)),
    "attention_only": (_AttentionOnly, lambda: torch.randn(2, 2, 5, 8)),
    # its attention fuses nothing of its own, yet holds the head its block's add runs through
    "vit_block": (VitBlock, lambda: torch.randn(2, 5, 16)),
}


def _save_torch(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    assert b"dnntune" not in buffer.getvalue()  # no class or state of dnntune's in the file
    buffer.seek(0)
    loaded: nn.Module = torch.load(buffer, weights_only=False)
    return loaded


def _save_pickle(model: nn.Module) -> nn.Module:
    data = pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"dnntune" not in data
    loaded: nn.Module = pickle.loads(data)
    return loaded


SAVES = {"torch.save": _save_torch, "pickle": _save_pickle}


def _models(name: str, device: str = "cpu") -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(reference, model to optimize, example input): same parameters and statistics."""
    make, inputs = MODELS[name]
    torch.manual_seed(0)
    ref = make()
    randomize_batch_norms(ref)
    x = inputs()
    return ref.to(device).eval(), copy.deepcopy(ref).to(device).eval(), x.to(device)


def _dnntune_attributes(model: nn.Module) -> list[str]:
    return [k for m in model.modules() for k in m.__dict__ if k.startswith("_dnntune")]


def _assert_pytorch_twin(loaded: nn.Module, ref: nn.Module) -> None:
    """``loaded`` is ``ref``'s PyTorch model again: its classes, no dnntune state, same tensors."""
    assert [type(m) for m in loaded.modules()] == [type(m) for m in ref.modules()]
    assert _dnntune_attributes(loaded) == []
    assert list(loaded.state_dict()) == list(ref.state_dict())
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, atol=0, rtol=0, msg=key)


@pytest.mark.parametrize("cuda_graph", [False, True, "auto"])
@pytest.mark.parametrize("save", list(SAVES))
@pytest.mark.parametrize("name", list(MODELS))
def test_optimized_model_saves_and_loads_as_pytorch(
    name: str, save: str, cuda_graph: bool | Literal["auto"], tmp_path: Path
) -> None:
    ref, model, x = _models(name)
    keys = list(model.state_dict())
    report = dtt.optimize(
        model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=cuda_graph
    )
    assert type(model) is not type(ref)  # the root's class is swapped (routing, at least)
    assert report.fusions or report.swapped or name == "attention_only"
    with torch.no_grad():
        before = model(x)
    loaded = SAVES[save](model)
    _assert_pytorch_twin(loaded, ref)
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), before, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(loaded(x), ref(x), atol=ATOL, rtol=RTOL)
        # saving changed nothing in the optimized model
        torch.testing.assert_close(model(x), before, atol=0, rtol=0)
    assert _dnntune_attributes(model)


def test_expected_fusions_happen() -> None:
    """The shapes above take the swaps they stand for (else the round trips test less)."""
    _, model, x = _models("transformer_block")
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert "<root>: fc1 + gelu" in report.fusions
    assert any("residual add" in f for f in report.fusions)
    _, model, x = _models("nested_sequentials")
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert any("batchnorm" in f for r in report.swapped for f in r.fused)
    assert any(f.startswith("1:") for f in report.fusions)  # the bottleneck's residual
    assert any(f.startswith("2:") for f in report.fusions)  # the torchvision block's
    _, model, x = _models("vit_block")
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=None)
    assert "<root>: attn + ls1 + drop_path1 (identity in eval) + residual add" in report.fusions


@pytest.mark.parametrize("name", list(MODELS))
def test_loaded_model_can_be_optimized_again(name: str, tmp_path: Path) -> None:
    ref, model, x = _models(name)
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    loaded = _save_torch(model)
    report = dtt.optimize(loaded, (x,), policy="cached", overrides=tmp_path / "ov.json")
    assert [r.name for r in report.swapped] == [
        r.name for r in dtt.optimize(copy.deepcopy(ref), policy="heuristic").swapped
    ]
    assert type(loaded) is not type(ref)  # on dnntune again
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), ref(x), atol=ATOL, rtol=RTOL)
    _assert_pytorch_twin(_save_pickle(loaded), ref)  # and saves again


def test_copies_keep_the_optimized_classes(tmp_path: Path) -> None:
    ref, model, x = _models("nested_sequentials")
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json")
    classes = [type(m) for m in model.modules()]
    twin = copy.deepcopy(model)
    assert [type(m) for m in twin.modules()] == classes
    assert _dnntune_attributes(twin) == _dnntune_attributes(model)
    for m, t in zip(model.modules(), twin.modules(), strict=True):
        assert m is not t
        for key in m.__dict__.keys() & {"_parameters", "_buffers"}:
            for p, q in zip(m.__dict__[key].values(), t.__dict__[key].values(), strict=True):
                assert p is None or p.data_ptr() != q.data_ptr()
    shallow = copy.copy(model)
    assert type(shallow) is type(model) and shallow is not model
    # as copy.copy of any module: a new object sharing the old one's attribute values
    assert shallow.__dict__.keys() == model.__dict__.keys()
    assert all(shallow.__dict__[k] is v for k, v in model.__dict__.items())
    with torch.no_grad():
        torch.testing.assert_close(twin(x), ref(x), atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(shallow(x), ref(x), atol=ATOL, rtol=RTOL)


def test_dnntune_module_classes_save_as_pytorch_classes() -> None:
    for pytorch, dnntune in SWAPS.items():
        assert pytorch.__name__ in dnntune.__name__
    conv = nn.Conv2d(2, 2, 1)
    conv.__class__ = SWAPS[nn.Conv2d]
    loaded: Any = pickle.loads(pickle.dumps(conv))
    assert type(loaded) is nn.Conv2d
    torch.testing.assert_close(loaded.weight, conv.weight, atol=0, rtol=0)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert type(pickle.loads(pickle.dumps(conv, protocol=protocol))) is nn.Conv2d


def test_saved_file_loads_without_dnntune(tmp_path: Path) -> None:
    ref, model, x = _models("conv_bn_relu")
    dtt.optimize(model, (x,), policy="heuristic", overrides=tmp_path / "ov.json", cuda_graph=True)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    torch.save((x, ref(x).detach()), tmp_path / "io.pt")
    script = (
        "import sys; sys.modules['dnntune'] = None\n"  # any import of dnntune fails
        "import torch\n"
        f"model = torch.load({str(path)!r}, weights_only=False)\n"
        f"x, expected = torch.load({str(tmp_path / 'io.pt')!r})\n"
        f"torch.testing.assert_close(model(x), expected, atol={ATOL}, rtol={RTOL})\n"
        "print(type(model).__module__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch.nn.modules.container"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["conv_bn_relu", "transformer_block"])
def test_cuda_graph_model_saves_and_loads(name: str, tmp_path: Path) -> None:
    ref, model, x = _models(name, "cuda")
    ov = tmp_path / "ov.json"
    report = dtt.optimize(model, (x,), policy="heuristic", overrides=ov, cuda_graph=True)
    assert report.cuda_graph and graphs_of(model).records > 0  # replayed before saving
    with torch.no_grad():
        before = model(x)
    for save in SAVES.values():
        loaded = save(model)
        _assert_pytorch_twin(loaded, ref)
        assert next(loaded.parameters()).is_cuda
        with torch.no_grad():
            # PyTorch's ops against dnntune's plans (TF32 engines on the GPU)
            torch.testing.assert_close(loaded(x), before, atol=2e-2, rtol=2e-2)
    loaded = _save_torch(model)
    again = dtt.optimize(loaded, (x,), policy="cached", overrides=ov, cuda_graph=True)
    assert again.cuda_graph and graphs_of(loaded).records > 0
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), before, atol=2e-2, rtol=2e-2)
    assert graphs_of(model).records > 0  # the original keeps its recordings


def test_models_optimized_alike_keep_one_class() -> None:
    """Each optimize made classes of its own (a fused Sequential, a rewritten forward), so two
    models of one class no longer had one: torch.func.stack_module_state refused them, the
    ensembling recipe (new-user audit, session 18)."""
    from torch.func import stack_module_state

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1)
            self.head = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.conv(x) + x)
            return self.head(y.mean(dim=(2, 3)))

    models = [Block().eval() for _ in range(2)]
    refs = [copy.deepcopy(m) for m in models]  # PyTorch's, each with its own weights
    x = torch.randn(2, 4, 6, 6)
    for m in models:
        report = dtt.optimize(m, (x,), policy="heuristic", overrides=None, check_speed=False)
        assert report.fusions  # the rewrite and the Sequential fusion both ran
    assert type(models[0]) is type(models[1])
    assert type(models[0].head) is type(models[1].head)
    stack_module_state(models)  # type: ignore[arg-type]
    with torch.no_grad():
        for m, ref in zip(models, refs, strict=True):  # each its own rewrite, its own weights
            torch.testing.assert_close(m(x), ref(x), atol=1e-5, rtol=1e-5)
