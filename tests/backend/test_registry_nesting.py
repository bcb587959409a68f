"""Nested extra_engines blocks inside an exclusive block add engines to the visible set."""

from __future__ import annotations

from dnntune import testing
from dnntune.backend.registry import get_registry


def test_nested_extra_engines_visible_inside_exclusive_block() -> None:
    registry = get_registry()
    with testing.fake_engines(names=[testing.FAKE_ENGINE_A]) as outer:
        assert [e.name for e in registry.engines()] == [testing.FAKE_ENGINE_A]
        extra = outer.engines[testing.FAKE_ENGINE_A]
        with testing.fake_engines(names=[testing.FAKE_ENGINE_C], exclusive=False) as inner:
            names = [e.name for e in registry.engines()]
            assert names == [testing.FAKE_ENGINE_A, testing.FAKE_ENGINE_C]
            assert inner.engines[testing.FAKE_ENGINE_C] in registry.engines()
        assert registry.engines() == [extra]
    assert testing.FAKE_ENGINE_A not in [e.name for e in registry.engines()]
