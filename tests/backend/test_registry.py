"""The engine registry: lazy built-ins, entry-point providers, registration, import weight."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import dnntune as dt
from dnntune.backend.registry import ENTRY_POINT_GROUP, EngineRegistry

PROVIDER_SOURCE = '''
from dnntune.providers.torch_eager import TorchEngine


class PluginEngine(TorchEngine):
    """A third-party engine: TORCH_ENGINE's lowering under another name."""

    name = "PLUGIN_ENGINE"
    provider = "plugin"


def engines():
    return [PluginEngine()]


def broken():
    raise RuntimeError("plugin exploded")
'''


def _install_plugin(root: Path, entry_points: str) -> None:
    (root / "dnntune_test_plugin.py").write_text(PROVIDER_SOURCE)
    dist = root / "dnntune_test_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dnntune-test-plugin\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry_points}\n")


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    monkeypatch.undo()
    sys.modules.pop("dnntune_test_plugin", None)
    importlib.invalidate_caches()
    dt.get_registry().reload()


def test_entry_point_provider_is_loaded(plugin_path: Path, cpu_handle: dt.Handle) -> None:
    _install_plugin(plugin_path, "plugin = dnntune_test_plugin:engines")
    importlib.invalidate_caches()
    registry = dt.get_registry()
    registry.reload()
    engine = registry.get("PLUGIN_ENGINE")
    assert engine.provider == "plugin"
    g = dt.Graph("plugged", io_data_type=dt.DataType.FLOAT)
    x = g.tensor("X", [2, 3])
    g.pointwise(x, mode=dt.PointwiseMode.TANH_FWD).set_output(True)
    g.build_operation_graph(cpu_handle)
    assert "PLUGIN_ENGINE" in [e.name for e in registry.applicable(g, cpu_handle)]
    g.create_execution_plan_ext("PLUGIN_ENGINE")
    g.build_plans()
    assert g.get_plan_name() == "PLUGIN_ENGINE"


def test_broken_entry_point_is_reported_not_fatal(plugin_path: Path) -> None:
    _install_plugin(plugin_path, "plugin = dnntune_test_plugin:broken")
    importlib.invalidate_caches()
    registry = dt.get_registry()
    registry.reload()
    assert "TORCH_ENGINE" in [e.name for e in registry.engines()]
    errors = registry.load_errors
    assert errors["entry point plugin"] == "RuntimeError: plugin exploded"


def test_registering_a_duplicate_is_refused() -> None:
    from dnntune.providers.torch_eager import TorchEngine

    with pytest.raises(dt.InvalidValueError, match=r"TORCH_ENGINE .* is already registered"):
        dt.get_registry().register(TorchEngine())


def test_extra_engines_exclusive_hides_the_rest() -> None:
    from dnntune.providers.torch_eager import TorchEngine

    class Solo(TorchEngine):
        name = "SOLO_ENGINE"

    registry = dt.get_registry()
    with registry.extra_engines([Solo()], exclusive=True):
        assert [e.name for e in registry.engines()] == ["SOLO_ENGINE"]
    assert "TORCH_ENGINE" in [e.name for e in registry.engines()]


def test_missing_builtin_provider_is_skipped() -> None:
    registry = EngineRegistry(
        ("dnntune.providers.not_written_yet:engines", "dnntune.providers.torch_eager:engines"),
        entry_points=False,
    )
    assert [e.name for e in registry.engines()] == ["TORCH_ENGINE"]
    assert registry.load_errors == {}


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return result.stdout.strip()


def test_import_dnntune_is_light() -> None:
    out = _run("""
        import sys
        import dnntune
        heavy = [m for m in ("triton", "cudnn", "torch._dynamo", "torch._inductor",
                             "dnntune.providers.torch_eager") if m in sys.modules]
        print(",".join(heavy) or "none")
    """)
    assert out == "none"


def test_loading_the_torch_providers_imports_neither_triton_nor_cudnn() -> None:
    out = _run("""
        import sys
        import dnntune
        from dnntune.backend.registry import EngineRegistry
        names = [e.name for e in EngineRegistry(("dnntune.providers.torch_eager:engines",
                 "dnntune.providers.torch_compile:engines"), entry_points=False).engines()]
        heavy = [m for m in ("triton", "cudnn", "torch._dynamo") if m in sys.modules]
        print(",".join(names), ",".join(heavy) or "none")
    """)
    assert out == "TORCH_ENGINE,TORCH_COMPILE_ENGINE none"
