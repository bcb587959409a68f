"""The direct cuDNN caller without a GPU (providers/cudnn/direct.py, direct_source.py).

The compiled helper is driven with fake cuDNN backend functions (ctypes callbacks that record
what they are given), so its own logic is checked on any machine with a C++ compiler: the
variant pack it builds (uids, addresses in slot order, constants, values passed by value, the
workspace), one pack per address set and most recent first within its limit, errors raised
with cuDNN's text, and every descriptor destroyed. The layout rules (what keeps the frontend's
execute) are checked on serializations written here."""

from __future__ import annotations

import ctypes
import gc
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ubjson_helpers import encode

from dnntune.backend import native
from dnntune.providers.cudnn import direct
from dnntune.providers.cudnn.direct_source import HELPER

V = ctypes.c_void_p
ENUMS = (16, 1000, 1001, 1003, 3, 6)  # variant pack descriptor, its attributes, INT64, VOID_PTR


class FakeBackend:
    """cuDNN's backend functions as ctypes callbacks that record their calls."""

    def __init__(self) -> None:
        self.next = 0x1000
        self.packs: dict[int, dict[str, Any]] = {}
        self.executes: list[tuple[int, int, int]] = []
        self.destroyed: list[int] = []
        self.fail_execute = 0
        self.fail_finalize = 0

        def create(kind: int, out: Any) -> int:
            self.next += 0x10
            out[0] = self.next
            self.packs[self.next] = {"kind": kind}
            return 0

        def set_attr(desc: int, name: int, typ: int, count: int, values: int) -> int:
            pack = self.packs[desc]
            if name == 1000:
                pack["uids"] = list((ctypes.c_int64 * count).from_address(values))
            elif name == 1001:
                pack["ptrs"] = [p or 0 for p in (V * count).from_address(values)]
            elif name == 1003:
                pack["ws"] = V.from_address(values).value or 0
            return 0

        def finalize(desc: int) -> int:
            return self.fail_finalize

        def execute(handle: int, plan: int, pack: int) -> int:
            self.executes.append((handle or 0, plan or 0, pack or 0))
            return self.fail_execute

        def destroy(desc: int) -> int:
            self.destroyed.append(desc or 0)
            return 0

        self.text = ctypes.create_string_buffer(b"CUDNN_STATUS_FAKE_ERROR")

        def error(status: int) -> int:
            return ctypes.addressof(self.text)

        self.keep = [
            ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(V))(create),
            ctypes.CFUNCTYPE(ctypes.c_int, V, ctypes.c_int, ctypes.c_int, ctypes.c_int64, V)(
                set_attr
            ),
            ctypes.CFUNCTYPE(ctypes.c_int, V)(finalize),
            ctypes.CFUNCTYPE(ctypes.c_int, V, V, V)(execute),
            ctypes.CFUNCTYPE(ctypes.c_int, V)(destroy),
            ctypes.CFUNCTYPE(V, ctypes.c_int)(error),
        ]

    def functions(self) -> bytes:
        addresses = [ctypes.cast(f, V).value or 0 for f in self.keep]
        data_ptr = torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr
        return struct.pack("7Q", *addresses, data_ptr)


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if not native.can_build(cxx=True):
        pytest.skip("no C++ compiler or Python headers here")
    monkeypatch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path))
    native._state.pop("cudnn", None)
    built = native.compiled(HELPER)
    assert built is not None
    yield built
    native._state.pop("cudnn", None)


def _make(
    module: Any, fake: FakeBackend, slots: list[int], consts: list[int], n: int, limit: int = 8
) -> Any:
    uids = [10 + i for i in range(len(slots))]
    return module.make(
        fake.functions(),
        0xBEEF,
        ENUMS,
        struct.pack(f"{len(uids)}q", *uids),
        struct.pack(f"{len(consts)}Q", *consts),
        struct.pack(f"{len(slots)}i", *slots),
        n,
        torch.Tensor,
        limit,
    )


def test_the_pack_holds_items_constants_values_and_the_workspace(module: Any) -> None:
    fake = FakeBackend()
    # slots: item 1, a constant address, item 0, a value passed by value
    capsule = _make(module, fake, [1, -1, 0, -2], [0, 0xABC0, 0, 0x3E000000], n=2)
    a, b = torch.zeros(4), torch.ones(8)
    module.run(capsule, (a, b), 0x5000, 0x77)
    ((handle, plan, pack),) = fake.executes
    assert (handle, plan) == (0x77, 0xBEEF)
    made = fake.packs[pack]
    assert made["kind"] == 16 and made["uids"] == [10, 11, 12, 13] and made["ws"] == 0x5000
    ptrs = made["ptrs"]
    assert ptrs[:3] == [b.data_ptr(), 0xABC0, a.data_ptr()]
    # the by-value slot points at the value, kept in the capsule (read as a float: 0.125)
    assert ctypes.c_float.from_address(ptrs[3]).value == 0.125


def test_one_pack_per_address_set_whatever_form_the_addresses_take(module: Any) -> None:
    fake = FakeBackend()
    capsule = _make(module, fake, [0, 1], [0, 0], n=2)
    a, b = torch.zeros(4), torch.ones(8)
    forms = [
        (a, b),
        [a, b],
        (a.data_ptr(), b.data_ptr()),
        struct.pack("2Q", a.data_ptr(), b.data_ptr()),
    ]
    for items in forms * 2:
        module.run(capsule, items, 0, 1)
    assert module.packs(capsule) == 1 and len({p for _, _, p in fake.executes}) == 1
    module.run(capsule, (torch.zeros(4), b), 0, 1)  # a new address: a new pack
    assert module.packs(capsule) == 2
    module.run(capsule, (a, b), 64, 1)  # another workspace: another pack
    assert module.packs(capsule) == 3


def test_the_packs_are_bounded_and_the_least_recently_used_goes(module: Any) -> None:
    fake = FakeBackend()
    capsule = _make(module, fake, [0], [0], n=1, limit=2)
    first, second, third = 0x100, 0x200, 0x300
    module.run(capsule, (first,), 0, 1)
    pack_first = fake.executes[-1][2]
    module.run(capsule, (second,), 0, 1)
    pack_second = fake.executes[-1][2]
    module.run(capsule, (first,), 0, 1)  # a hit: first is the most recent again
    assert fake.executes[-1][2] == pack_first and not fake.destroyed
    module.run(capsule, (third,), 0, 1)
    assert fake.destroyed == [pack_second] and module.packs(capsule) == 2
    module.run(capsule, (first,), 0, 1)
    assert fake.executes[-1][2] == pack_first  # still kept


def test_cudnn_errors_are_raised_with_cudnn_s_text(module: Any) -> None:
    fake = FakeBackend()
    capsule = _make(module, fake, [0], [0], n=1)
    fake.fail_execute = 5000
    with pytest.raises(
        RuntimeError, match=r"execute failed: CUDNN_STATUS_FAKE_ERROR \(status 5000\)"
    ):
        module.run(capsule, (0x100,), 0, 1)
    fake.fail_execute = 0
    fake.fail_finalize = 2000
    with pytest.raises(RuntimeError, match="variant pack failed"):
        module.run(capsule, (0x200,), 0, 1)
    assert len(fake.destroyed) == 1  # the half-made pack
    assert module.packs(capsule) == 1  # only the first (made before the failure)


def test_bad_items_are_refused(module: Any) -> None:
    fake = FakeBackend()
    capsule = _make(module, fake, [0, 1], [0, 0], n=2)
    with pytest.raises(ValueError, match="2 items expected"):
        module.run(capsule, (torch.zeros(1),), 0, 1)
    with pytest.raises(TypeError, match="item 1 is a str"):
        module.run(capsule, (torch.zeros(1), "x"), 0, 1)
    with pytest.raises(ValueError, match="2 addresses expected"):
        module.run(capsule, b"\0" * 8, 0, 1)
    with pytest.raises(ValueError, match="item index past"):
        _make(module, fake, [0, 3], [0, 0], n=2)
    assert not fake.executes


def test_a_dropped_capsule_destroys_its_packs_and_its_plan(module: Any) -> None:
    fake = FakeBackend()
    capsule = _make(module, fake, [0], [0], n=1)
    for address in (0x100, 0x200, 0x300):
        module.run(capsule, (address,), 0, 1)
    packs = {p for _, _, p in fake.executes}
    del capsule
    gc.collect()
    assert set(fake.destroyed) == packs | {0xBEEF}


# ---- the layout rules ----------------------------------------------------------------------
BASE = {
    "cudnn_backend_data": '{"engine": 1}',
    "variant_pack_uids": [4, 3, 0],
    "pass_by_values": [],
    "workspace_modifications": [],
    "variant_pack_replacements": [],
    "fe_workspace_size": 0,
}


def test_a_plan_layout_is_read_with_its_by_value_values() -> None:
    assert direct.plan_layout(encode(BASE)) == ('{"engine": 1}', [4, 3, 0], {})
    scaled = BASE | {"pass_by_values": [[4, {"index": 3, "value": "3E000000"}]]}
    assert direct.plan_layout(encode(scaled)) == ('{"engine": 1}', [4, 3, 0], {4: 0x3E000000})
    keyed = BASE | {"pass_by_values": {"4": {"index": 2, "value": "3F800000"}}}
    assert direct.plan_layout(encode(keyed)) == ('{"engine": 1}', [4, 3, 0], {4: 0x3C00})


@pytest.mark.parametrize(
    "change",
    [
        {"workspace_modifications": {"1": [0, 0, [1.0]]}},
        {"variant_pack_replacements": {"1": [2, 64]}},
        {"fe_workspace_size": 64},
        {"variant_pack_uids": []},
        {"variant_pack_uids": [1, 1]},
        {"variant_pack_uids": ["1"]},
        {"cudnn_backend_data": ""},
        {"pass_by_values": [[4, {"index": 7, "value": 1}]]},
        {"pass_by_values": [[4, {"index": 3, "value": "3E00"}]]},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_plan_the_frontend_does_more_for_keeps_the_frontend(change: dict[str, Any]) -> None:
    assert direct.plan_layout(encode(BASE | change)) is None


def test_no_direct_call_without_a_blob_or_with_the_helpers_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blob = encode(BASE)
    assert direct.direct_call(None, 1, [4, 3, 0], {}, 0) is None
    assert direct.plan_layout(b"not ubjson") is None
    monkeypatch.setattr(direct, "backend_library", lambda: object())
    monkeypatch.setenv("DNNTUNE_DISABLE_CUDNN_DIRECT", "1")
    assert direct.direct_call(blob, 1, [4, 3, 0], {}, 0) is None
    monkeypatch.delenv("DNNTUNE_DISABLE_CUDNN_DIRECT")
    monkeypatch.setenv("DNNTUNE_DISABLE_NATIVE", "1")
    assert direct.direct_call(blob, 1, [4, 3, 0], {}, 0) is None
    monkeypatch.delenv("DNNTUNE_DISABLE_NATIVE")
    # a uid of the plan's pack that the call neither gives nor holds as a constant
    called: list[Any] = []
    monkeypatch.setattr(native, "compiled", lambda helper: called.append(helper))
    assert direct.direct_call(blob, 1, [4, 3], {}, 0) is None
    assert not called  # refused before any helper is built
