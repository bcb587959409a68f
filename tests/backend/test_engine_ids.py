"""Engine ids (64-bit FNV-1a, signed) and the parsing of engine names and ids."""

from __future__ import annotations

import pytest

import dnntune as dt
from dnntune.backend.engine import engine_id, engine_name_or_id


def fnv1a_64(text: str) -> int:
    """64-bit FNV-1a, written out here independently of dnntune, as a signed int64."""
    value = 14695981039346656037
    for byte in text.encode("utf-8"):
        value = ((value ^ byte) * 1099511628211) % 2**64
    return value - 2**64 if value >= 2**63 else value


def test_known_fnv1a_values() -> None:
    # the empty string hashes to the offset basis; "a" is the classic test vector
    assert engine_id("") == fnv1a_64("") == 0xCBF29CE484222325 - 2**64
    assert engine_id("a") == 0xAF63DC4C8601EC8C - 2**64
    assert engine_id("TORCH_ENGINE") == fnv1a_64("TORCH_ENGINE")
    assert engine_id("TORCH_COMPILE_ENGINE") == fnv1a_64("TORCH_COMPILE_ENGINE")


def test_ids_are_signed_int64_and_stable() -> None:
    for name in ("TORCH_ENGINE", "TORCH_COMPILE_ENGINE", "CUDNN_ENGINE", "TRITON_ENGINE"):
        value = engine_id(name)
        assert -(2**63) <= value < 2**63
        assert value == engine_id(name)
    assert dt.get_registry().get("TORCH_ENGINE").id == fnv1a_64("TORCH_ENGINE")


@pytest.mark.parametrize("name", ["TORCH_ENGINE", "TORCH_COMPILE_ENGINE"])
def test_name_decimal_and_hex_agree(name: str) -> None:
    value = fnv1a_64(name)
    unsigned = value % 2**64
    assert engine_name_or_id(name) == value
    assert engine_name_or_id(f"  {name} ") == value
    assert engine_name_or_id(str(value)) == value
    assert engine_name_or_id(value) == value
    assert engine_name_or_id(hex(unsigned)) == value  # two's complement: wraps to negative
    assert engine_name_or_id(hex(unsigned).upper().replace("0X", "0x")) == value


def test_negative_and_small_ids() -> None:
    assert engine_name_or_id("-42") == -42
    assert engine_name_or_id("-0x2a") == -42
    assert engine_name_or_id("0x7fffffffffffffff") == 2**63 - 1
    assert engine_name_or_id("0x8000000000000000") == -(2**63)
    assert engine_name_or_id("17") == 17


def test_empty_reference_is_refused() -> None:
    with pytest.raises(dt.InvalidValueError, match="empty engine name or id"):
        engine_name_or_id("  ")


def test_registry_lookups_by_every_spelling() -> None:
    registry = dt.get_registry()
    engine = registry.get("TORCH_ENGINE")
    unsigned = engine.id % 2**64
    for ref in ("TORCH_ENGINE", str(engine.id), hex(unsigned), engine.id, engine):
        assert registry.get(ref) is engine
    with pytest.raises(
        dt.InvalidValueError, match="unknown engine 'NO_SUCH_ENGINE'; known engines"
    ):
        registry.get("NO_SUCH_ENGINE")
    assert registry.find("NO_SUCH_ENGINE") is None
