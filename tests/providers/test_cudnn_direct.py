"""The direct cuDNN caller without a GPU (providers/cudnn/direct.py, direct_source.py).

The layout rules (which serializations keep the frontend's execute) run on documents written
with the UBJSON encoder of test_cudnn_ubjson.py. The compiled helper runs against fake cuDNN
backend functions (ctypes callbacks that record what they are given) and PyTorch's real
``data_ptr`` function on CPU tensors: the variant pack it builds, one pack per address set kept
most recent first within its limit, errors with cuDNN's text, every descriptor destroyed; and
``direct_call`` end to end on a fake libcudnn."""

from __future__ import annotations

import ctypes
import functools
import gc
import struct
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from test_cudnn_ubjson import encode, frontend_document

from dnntune.backend import native
from dnntune.providers.cudnn import direct
from dnntune.providers.cudnn.direct_source import HELPER

needs_compiler = pytest.mark.skipif(
    not native.can_build(cxx=True), reason="no C++ compiler or Python headers here"
)

DATA_PTR: int = torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr  # type: ignore[attr-defined]

V = ctypes.c_void_p
CREATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(V))
SET = ctypes.CFUNCTYPE(ctypes.c_int, V, ctypes.c_int, ctypes.c_int, ctypes.c_int64, V)
GET = ctypes.CFUNCTYPE(
    ctypes.c_int, V, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), V
)
FINALIZE = ctypes.CFUNCTYPE(ctypes.c_int, V)
EXECUTE = ctypes.CFUNCTYPE(ctypes.c_int, V, V, V)
DESTROY = ctypes.CFUNCTYPE(ctypes.c_int, V)
ERRSTR = ctypes.CFUNCTYPE(V, ctypes.c_int)  # an address: a char* result of a Python callback
# would point into a bytes object ctypes does not keep

# the helper is given its enum values: made-up ones here, so a test sees it uses what it is given
PACK_KIND, UIDS, POINTERS, WORKSPACE, INT64, POINTER = 116, 2000, 2001, 2003, 33, 66
ENUMS = (PACK_KIND, UIDS, POINTERS, WORKSPACE, INT64, POINTER)
REAL_ENUMS = (16, 1000, 1001, 1003, 3, 6)  # cuDNN 9's, as direct.py passes them
PLAN = 0x5A5A00
HANDLE = 0x4800

#: every fake's callbacks stay alive for the whole run: a capsule a failing test's traceback
#: keeps may be released (and call destroy) after its test has ended
_KEPT: list[Any] = []


class FakeBackend:
    """cuDNN's backend functions as ctypes callbacks that record their calls; ``status`` makes
    one of them fail (``cudnnGetErrorString`` then says ``FAKE_STATUS_<n>``)."""

    def __init__(self, int64: int = INT64, pointer: int = POINTER) -> None:
        self.int64, self.pointer = int64, pointer
        self.next_address = 0x10000
        self.created: list[tuple[int, int]] = []  # (kind, descriptor)
        self.attributes: dict[int, dict[int, tuple[int, int, Any]]] = {}  # name: (type, n, v)
        self.finalized: list[int] = []
        self.executes: list[tuple[int, int, int]] = []
        self.destroyed: list[int] = []
        self.status = {"create": 0, "set": 0, "finalize": 0, "execute": 0}
        self.workspace_size = 0
        self.texts: dict[int, Any] = {}
        self.callbacks = [
            CREATE(self._create),
            SET(self._set),
            FINALIZE(self._finalize),
            EXECUTE(self._execute),
            DESTROY(self._destroy),
            ERRSTR(self._error),
            GET(self._get),
        ]
        _KEPT.append(self)

    def _create(self, kind: int, out: Any) -> int:
        if self.status["create"]:
            return self.status["create"]
        self.next_address += 0x100
        out[0] = self.next_address
        self.created.append((kind, self.next_address))
        self.attributes[self.next_address] = {}
        return 0

    def _set(self, desc: int | None, name: int, kind: int, count: int, values: int | None) -> int:
        assert desc is not None and values is not None
        if kind == self.int64:
            value: Any = list((ctypes.c_int64 * count).from_address(values))
        elif kind == self.pointer or kind == 0:  # pointers, or a handle
            value = [p or 0 for p in (V * count).from_address(values)]
        elif kind == 24:  # chars
            value = ctypes.string_at(values, count).decode()
        else:
            raise AssertionError(f"attribute type {kind}")
        self.attributes[desc][name] = (kind, count, value)
        return self.status["set"]

    def _finalize(self, desc: int | None) -> int:
        self.finalized.append(desc or 0)
        return self.status["finalize"]

    def _execute(self, handle: int | None, plan: int | None, pack: int | None) -> int:
        self.executes.append((handle or 0, plan or 0, pack or 0))
        return self.status["execute"]

    def _destroy(self, desc: int | None) -> int:
        self.destroyed.append(desc or 0)
        return 0

    def _error(self, status: int) -> int:
        text = self.texts.setdefault(
            status, ctypes.create_string_buffer(b"FAKE_STATUS_%d" % status)
        )
        return ctypes.addressof(text)

    def _get(self, desc: Any, name: int, kind: int, n: int, count: Any, out: int | None) -> int:
        assert (name, kind, n) == (402, 3, 1) and out is not None  # the plan's workspace size
        ctypes.c_int64.from_address(out).value = self.workspace_size
        count[0] = 1
        return 0

    def functions(self) -> bytes:
        """``make``'s first argument: the six backend functions' addresses and data_ptr's."""
        addresses = [ctypes.cast(c, V).value or 0 for c in self.callbacks[:6]]
        return struct.pack("7Q", *addresses, DATA_PTR)

    def packs(self) -> list[int]:
        return [d for kind, d in self.created if kind in (PACK_KIND, REAL_ENUMS[0])]

    def pack(self, desc: int) -> dict[str, Any]:
        """A variant pack's uids, pointers and workspace, as set (with their types' checks)."""
        attributes = self.attributes[desc]
        names = (UIDS, POINTERS, WORKSPACE) if UIDS in attributes else REAL_ENUMS[1:4]
        uids, pointers, workspace = (attributes[n] for n in names)
        assert uids[0] == self.int64 and pointers[0] == self.pointer == workspace[0]
        assert uids[1] == pointers[1] == len(uids[2]) and workspace[1] == 1
        return {"uids": uids[2], "pointers": pointers[2], "workspace": workspace[2][0]}

    def library(self) -> types.SimpleNamespace:
        """A stand-in for the libcudnn ctypes.CDLL that direct_call uses."""
        create, set_, finalize, execute, destroy, error, get = self.callbacks
        return types.SimpleNamespace(
            cudnnBackendCreateDescriptor=create,
            cudnnBackendSetAttribute=set_,
            cudnnBackendGetAttribute=get,
            cudnnBackendFinalize=finalize,
            cudnnBackendExecute=execute,
            cudnnBackendDestroyDescriptor=destroy,
            cudnnGetErrorString=error,
        )


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[types.ModuleType]:
    """The compiled helper, built once for this module in a cache folder of its own, by a
    process that has not looked for dnntune's helpers yet."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "_state", {})
        patch.setattr(native, "_key_locks", {})
        patch.setenv("DNNTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("direct-native")))
        patch.delenv("DNNTUNE_DISABLE_NATIVE", raising=False)
        patch.delenv("DNNTUNE_DISABLE_CACHE", raising=False)
        module = native.compiled(HELPER)
        if module is None:  # compiled() logs why; build() says it
            native.build(Path(str(tmp_path_factory.mktemp("direct-why"))), helper=HELPER)
            pytest.fail("the cuDNN helper was not built")
    yield module


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


def make(
    module: types.ModuleType,
    fake: FakeBackend,
    slots: Sequence[int],
    uids: Sequence[int] | None = None,
    consts: Sequence[int] | None = None,
    n_items: int = 3,
    limit: int = 8,
) -> Any:
    uids = list(uids if uids is not None else range(10, 10 + len(slots)))
    consts = list(consts if consts is not None else [0] * len(slots))
    n = len(uids)
    return module.make(
        fake.functions(),
        PLAN,
        ENUMS,
        struct.pack(f"{n}q", *uids),
        struct.pack(f"{len(consts)}Q", *consts),
        struct.pack(f"{len(slots)}i", *slots),
        n_items,
        torch.Tensor,
        limit,
    )


def tensors(n: int = 3) -> tuple[torch.Tensor, ...]:
    return tuple(torch.zeros(4 + i) for i in range(n))


def addresses(items: Sequence[torch.Tensor]) -> list[int]:
    return [t.data_ptr() for t in items]


# --- plan_layout ---------------------------------------------------------------------------


def _blob(**changes: Any) -> bytes:
    return encode(frontend_document(**changes))


def test_a_frontend_serialization_gives_its_json_and_uids() -> None:
    document = frontend_document()
    layout = direct.plan_layout(encode(document))
    assert layout == (document["cudnn_backend_data"], [4, 3, 0, 1, 2], {})
    assert direct.plan_layout(encode(document, "counted")) == layout
    # nlohmann writes an empty unordered_map with integer keys as an empty array
    empty_arrays = {k: [] for k in ("pass_by_values", "workspace_modifications")}
    assert direct.plan_layout(_blob(variant_pack_replacements=[], **empty_arrays)) == layout
    without = frontend_document()
    del without["fe_workspace_size"]
    assert direct.plan_layout(encode(without)) == layout


@pytest.mark.parametrize(
    "changes",
    [
        {"workspace_modifications": [[7, [0, 0, [1.0, 2.0]]]]},
        {"workspace_modifications": {"7": [0, 0, [1.0]]}},
        {"variant_pack_replacements": [[5, [6, 128]]]},
        {"fe_workspace_size": 64},
        {"variant_pack_uids": []},
        {"variant_pack_uids": None},
        {"variant_pack_uids": [4, 3, 4]},
        {"variant_pack_uids": [4, 3.0]},
        {"variant_pack_uids": [4, "3"]},
        {"variant_pack_uids": [4, True]},
        {"variant_pack_uids": {"4": 1}},
        {"cudnn_backend_data": ""},
        {"cudnn_backend_data": None},
        {"cudnn_backend_data": {"engineId": 6}},
        {"pass_by_values": [[2, {"index": 5, "value": 1}]]},
        {"pass_by_values": [[2, {"index": 3, "value": 0.1}]]},
        {"pass_by_values": [[2, {"index": 3, "value": "3DCC"}]]},
        {"pass_by_values": [[2, {"index": 3, "value": "notahex"}]]},
        {"pass_by_values": [[2, {"index": 0, "value": "00000001"}]]},
        {"pass_by_values": [[2, {"index": 3}]]},
        {"pass_by_values": [[2]]},
        {"pass_by_values": [[2, 3]]},
        {"pass_by_values": [["x", {"index": 0, "value": 1}]]},
        {"pass_by_values": "3DCCCCCD"},
    ],
    ids=lambda c: f"{next(iter(c))}={next(iter(c.values()))!r}"[:60],
)
def test_what_the_frontend_adds_at_execute_time_keeps_its_execute(changes: dict[str, Any]) -> None:
    assert direct.plan_layout(_blob(**changes)) is None


def test_a_document_without_uids_keeps_the_frontends_execute() -> None:
    document = frontend_document()
    del document["variant_pack_uids"]
    assert direct.plan_layout(encode(document)) is None
    document = frontend_document()
    del document["cudnn_backend_data"]
    assert direct.plan_layout(encode(document)) is None


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"not UBJSON at all",
        _blob()[:-1],
        _blob() + b"Z",
        encode([frontend_document()]),
        encode("cudnn_backend_data"),
        b"S" + encode(2) + b"\xff\xfe",
    ],
    ids=["empty", "text", "truncated", "trailing", "a_list", "a_string", "bad_utf8"],
)
def test_a_blob_that_is_not_a_serialization_gives_no_layout(blob: bytes) -> None:
    assert direct.plan_layout(blob) is None


def test_values_passed_by_value_are_kept_as_their_bytes() -> None:
    entries = [
        [20, {"index": 0, "value": -1}],  # int64
        [21, {"index": 1, "value": -2}],  # int32
        [22, {"index": 2, "value": "3DCCC000"}],  # half 0.1, written as the float it is
        [23, {"index": 3, "value": "3DCCCCCD"}],  # float 0.1 (attention's scale)
        [24, {"index": 3, "value": "FF800000"}],  # float -inf (a causal mask's value)
        [25, {"index": 4, "value": "3DCD0000"}],  # bfloat16 0.1, written as its float
    ]
    layout = direct.plan_layout(_blob(pass_by_values=entries))
    assert layout is not None
    assert layout[2] == {
        20: 0xFFFF_FFFF_FFFF_FFFF,
        21: 0xFFFF_FFFE,
        22: int.from_bytes(struct.pack("<e", 0.1), "little"),
        23: int.from_bytes(struct.pack("<f", 0.1), "little"),
        24: int.from_bytes(struct.pack("<f", float("-inf")), "little"),
        25: 0x3DCD,
    }
    assert layout[2][22] == 0x2E66
    keyed = {"7": {"index": 3, "value": "3f800000"}}  # an object keyed by uid, lower case hex
    assert direct.plan_layout(_blob(pass_by_values=keyed)) == (
        frontend_document()["cudnn_backend_data"],
        [4, 3, 0, 1, 2],
        {7: 0x3F80_0000},
    )


# --- direct_call: when it keeps the frontend's execute ---------------------------------------


def test_no_blob_keeps_the_frontends_execute(
    fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct, "backend_library", fake.library)
    assert direct.direct_call(None, HANDLE, [4, 3, 0, 1, 2], {}, 0) is None
    assert fake.created == []


@pytest.mark.parametrize("variable", ["DNNTUNE_DISABLE_NATIVE", "DNNTUNE_DISABLE_CUDNN_DIRECT"])
@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_the_environment_keeps_the_frontends_execute(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[bool] = []
    monkeypatch.setattr(direct, "backend_library", lambda: asked.append(True))
    monkeypatch.setattr(direct, "plan_layout", lambda blob: asked.append(True))
    monkeypatch.setenv(variable, value)
    assert direct.direct_call(_blob(), HANDLE, [4, 3, 0, 1, 2], {}, 0) is None
    assert asked == []


def test_no_cudnn_9_library_keeps_the_frontends_execute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "backend_library", lambda: None)
    monkeypatch.setattr(native, "compiled", lambda helper: pytest.fail("built without cuDNN"))
    assert direct.direct_call(_blob(), HANDLE, [4, 3, 0, 1, 2], {}, 0) is None


def test_a_uid_given_neither_as_an_item_nor_a_constant_keeps_the_frontends_execute(
    fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct, "backend_library", fake.library)
    monkeypatch.setattr(native, "compiled", lambda helper: pytest.fail("went on to the helper"))
    blob = _blob()  # uids 4, 3, 0, 1, 2
    assert direct.direct_call(blob, HANDLE, [4, 3, None, 1], {2: 0x100}, 0) is None
    assert direct.direct_call(blob, HANDLE, [4, 3, 0, 1], {}, 0) is None
    assert direct.direct_call(blob, HANDLE, [], {4: 1, 3: 1, 0: 1, 1: 1}, 0) is None
    assert fake.created == [], "no plan made"


def test_a_refused_layout_keeps_the_frontends_execute(
    fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct, "backend_library", fake.library)
    blob = _blob(fe_workspace_size=256)
    assert direct.direct_call(blob, HANDLE, [4, 3, 0, 1, 2], {}, 0) is None
    assert direct.direct_call(b"garbage", HANDLE, [4, 3, 0, 1, 2], {}, 0) is None
    assert fake.created == []


# --- the compiled helper on fake backend functions --------------------------------------------


@needs_compiler
def test_a_pack_holds_the_items_addresses_in_slot_order_and_the_constants(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    capsule = make(
        helper, fake, slots=[2, 0, -1, 1], uids=[4, 3, 0, 1], consts=[0, 0, 0xC0FFEE00, 0]
    )
    items = tensors()
    assert helper.run(capsule, items, 0xABC000, HANDLE) is None
    (pack,) = fake.packs()
    assert fake.created == [(PACK_KIND, pack)]
    a, b, c = addresses(items)
    assert fake.pack(pack) == {
        "uids": [4, 3, 0, 1],
        "pointers": [c, a, 0xC0FFEE00, b],
        "workspace": 0xABC000,
    }
    assert fake.finalized == [pack]
    assert fake.executes == [(HANDLE, PLAN, pack)]
    assert fake.destroyed == []
    assert helper.packs(capsule) == 1


@needs_compiler
def test_a_view_gives_its_own_address_not_its_storages(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    capsule = make(helper, fake, slots=[0], n_items=1)
    base = torch.zeros(64)
    view = base[8:]
    helper.run(capsule, (view,), 0, HANDLE)
    assert fake.pack(fake.packs()[0])["pointers"] == [base.data_ptr() + 8 * 4]


@needs_compiler
def test_a_value_passed_by_value_is_read_from_memory_the_capsule_keeps(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    value = 0x3DCC_CCCD
    capsule = make(helper, fake, slots=[0, -2], uids=[1, 2], consts=[0, value], n_items=1)
    helper.run(capsule, tensors(1), 0, HANDLE)
    helper.run(capsule, tensors(1), 0, HANDLE)  # new tensors: a second pack
    first, second = (fake.pack(p)["pointers"][1] for p in fake.packs())
    assert first == second != 0
    assert ctypes.c_uint64.from_address(first).value == value
    assert ctypes.c_float.from_address(first).value == pytest.approx(0.1)


@needs_compiler
def test_the_same_addresses_reuse_their_pack(helper: types.ModuleType, fake: FakeBackend) -> None:
    capsule = make(helper, fake, slots=[0, 1, 2])
    items = tensors()
    for _ in range(3):
        helper.run(capsule, items, 0x9000, HANDLE)
    (pack,) = fake.packs()
    assert helper.packs(capsule) == 1
    assert fake.executes == [(HANDLE, PLAN, pack)] * 3
    helper.run(capsule, items, 0x9000, HANDLE + 1)  # another handle: the same pack
    assert fake.executes[-1] == (HANDLE + 1, PLAN, pack)
    assert helper.packs(capsule) == 1


@needs_compiler
def test_new_addresses_or_another_workspace_build_a_new_pack(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    capsule = make(helper, fake, slots=[0, 1, 2])
    first, second = tensors(), tensors()
    helper.run(capsule, first, 0x9000, HANDLE)
    helper.run(capsule, second, 0x9000, HANDLE)
    assert helper.packs(capsule) == 2
    helper.run(capsule, first, 0xA000, HANDLE)
    assert helper.packs(capsule) == 3
    one, two, three = fake.packs()
    assert fake.pack(two)["pointers"] == addresses(second)
    assert fake.pack(three) == {
        "uids": [10, 11, 12],
        "pointers": addresses(first),
        "workspace": 0xA000,
    }
    assert [pack for _, _, pack in fake.executes] == [one, two, three]
    helper.run(capsule, second, 0x9000, HANDLE)  # each one is still there
    helper.run(capsule, first, 0x9000, HANDLE)
    assert [pack for _, _, pack in fake.executes][3:] == [two, one]
    assert len(fake.created) == 3


@needs_compiler
def test_items_may_be_tensors_ints_or_bytes_of_addresses(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    capsule = make(helper, fake, slots=[0, 1, 2])
    items = tensors()
    raw = addresses(items)
    for given in (
        items,
        list(items),
        tuple(raw),
        raw,
        (items[0], raw[1], items[2]),
        struct.pack("3Q", *raw),
    ):
        helper.run(capsule, given, 0x9000, HANDLE)
    (pack,) = fake.packs()
    assert fake.pack(pack)["pointers"] == raw
    assert fake.executes == [(HANDLE, PLAN, pack)] * 6
    helper.run(capsule, struct.pack("3Q", raw[0], raw[1], raw[2] + 16), 0x9000, HANDLE)
    assert fake.pack(fake.packs()[1])["pointers"] == [raw[0], raw[1], raw[2] + 16]


@needs_compiler
def test_more_items_than_the_stack_key_holds_work_the_same(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    n = 40
    capsule = make(helper, fake, slots=list(range(n - 1, -1, -1)), n_items=n)
    items = [0x1000 * (i + 1) for i in range(n)]
    helper.run(capsule, items, 0x9000, HANDLE)
    helper.run(capsule, tuple(items), 0x9000, HANDLE)
    (pack,) = fake.packs()
    assert fake.pack(pack)["pointers"] == items[::-1]
    helper.run(capsule, [*items[:-1], 0x10], 0x9000, HANDLE)  # only the last address differs
    assert len(fake.packs()) == 2


@needs_compiler
@pytest.mark.parametrize("offset", [1, 2, 4, 8])
def test_a_misaligned_address_runs_nothing_and_says_so(
    helper: types.ModuleType, fake: FakeBackend, offset: int
) -> None:
    """cuDNN plans are built for 16-byte aligned tensors (a misaligned GEMM returned wrong
    numbers on an H100): the helper makes no pack and executes nothing, it returns False for
    the caller to run the plan on aligned copies; aligned addresses run as before."""
    capsule = make(helper, fake, slots=[0, 1], n_items=2)
    assert helper.run(capsule, (0x1000, 0x2000 + offset), 0x9000, HANDLE) is False
    assert fake.packs() == [] and fake.executes == []
    packed = struct.pack("2Q", 0x1000 + offset, 0x2000)
    assert helper.run(capsule, packed, 0x9000, HANDLE) is False
    assert fake.packs() == [] and fake.executes == []
    assert helper.run(capsule, (0x1000, 0x2000), 0x9000, HANDLE) is None
    assert len(fake.executes) == 1


@needs_compiler
def test_the_cache_keeps_the_most_recently_used_packs_within_its_limit(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    capsule = make(helper, fake, slots=[0], n_items=1, limit=2)
    sets = {name: (0x1000 * i,) for i, name in enumerate("abcde", start=1)}
    pack: dict[str, int] = {}

    def run(name: str) -> None:
        helper.run(capsule, sets[name], 0x9000, HANDLE)
        pack[name] = fake.executes[-1][2]

    run("a")
    run("b")
    assert fake.destroyed == []
    run("c")  # a is the least recently used
    assert fake.destroyed == [pack["a"]]
    assert helper.packs(capsule) == 2
    run("b")  # a hit: b moves to the front, so c goes next
    assert len(fake.created) == 3
    run("d")
    assert fake.destroyed == [pack["a"], pack["c"]]
    assert helper.packs(capsule) == 2
    run("b")
    run("d")
    assert len(fake.created) == 4, "b and d are both kept"
    first_a = pack["a"]
    run("a")  # evicted: built again, and b (now the least recently used) goes
    assert len(fake.created) == 5
    assert fake.destroyed == [first_a, pack["c"], pack["b"]]
    assert pack["a"] != first_a
    assert fake.pack(pack["a"])["pointers"] == [0x1000]


@needs_compiler
@pytest.mark.parametrize("limit", [0, -3, 1])
def test_a_limit_below_one_keeps_one_pack(
    helper: types.ModuleType, fake: FakeBackend, limit: int
) -> None:
    capsule = make(helper, fake, slots=[0], n_items=1, limit=limit)
    helper.run(capsule, (0x1000,), 0, HANDLE)
    helper.run(capsule, (0x2000,), 0, HANDLE)
    assert helper.packs(capsule) == 1
    assert fake.destroyed == [fake.packs()[0]]


@needs_compiler
def test_a_failed_execute_raises_with_cudnns_text(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    capsule = make(helper, fake, slots=[0, 1, 2])
    fake.status["execute"] = 9
    with pytest.raises(RuntimeError, match=r"cuDNN execute failed: FAKE_STATUS_9 \(status 9\)"):
        helper.run(capsule, tensors(), 0, HANDLE)
    assert len(fake.executes) == 1
    fake.status["execute"] = 0
    helper.run(capsule, tensors(), 0, HANDLE)
    assert len(fake.executes) == 2


@needs_compiler
@pytest.mark.parametrize("failing", ["set", "finalize"])
def test_a_pack_that_fails_to_finalize_is_destroyed_and_raises(
    helper: types.ModuleType, fake: FakeBackend, failing: str
) -> None:
    capsule = make(helper, fake, slots=[0, 1, 2])
    items = tensors()
    fake.status[failing] = 3
    with pytest.raises(RuntimeError, match=r"cuDNN variant pack failed: FAKE_STATUS_3"):
        helper.run(capsule, items, 0, HANDLE)
    (pack,) = fake.packs()
    assert fake.destroyed == [pack]
    assert fake.executes == []
    assert helper.packs(capsule) == 0
    fake.status[failing] = 0
    helper.run(capsule, items, 0, HANDLE)  # built again, now that it can be
    assert helper.packs(capsule) == 1
    assert fake.executes == [(HANDLE, PLAN, fake.packs()[1])]


@needs_compiler
def test_a_pack_that_cannot_be_created_raises_and_destroys_nothing(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    capsule = make(helper, fake, slots=[0, 1, 2])
    fake.status["create"] = 4
    with pytest.raises(RuntimeError, match="variant pack creation failed: FAKE_STATUS_4"):
        helper.run(capsule, tensors(), 0, HANDLE)
    assert fake.destroyed == [] and fake.executes == []
    assert helper.packs(capsule) == 0


@needs_compiler
def test_bad_items_are_refused_before_anything_is_built(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    capsule = make(helper, fake, slots=[0, 1, 2])
    items = tensors()
    with pytest.raises(ValueError, match="3 items expected"):
        helper.run(capsule, items[:2], 0, HANDLE)
    with pytest.raises(ValueError, match="3 items expected"):
        helper.run(capsule, [*items, items[0]], 0, HANDLE)
    with pytest.raises(TypeError, match="item 1 is a str, not a tensor"):
        helper.run(capsule, (items[0], "x", items[2]), 0, HANDLE)
    with pytest.raises(TypeError, match="item 2 is a float"):
        helper.run(capsule, (1, 2, 3.0), 0, HANDLE)
    with pytest.raises(TypeError, match="must be a sequence"):
        helper.run(capsule, 5, 0, HANDLE)
    with pytest.raises(ValueError, match="3 addresses expected"):
        helper.run(capsule, struct.pack("2Q", 1, 2), 0, HANDLE)
    with pytest.raises(ValueError, match="3 addresses expected"):
        helper.run(capsule, struct.pack("3Q", 1, 2, 3) + b"\x00", 0, HANDLE)
    with pytest.raises(OverflowError):
        helper.run(capsule, (1, -2, 3), 0, HANDLE)
    with pytest.raises(OverflowError):
        helper.run(capsule, (1, 2, 3), -1, HANDLE)
    with pytest.raises(TypeError):
        helper.run(capsule, (1, 2, 3), 0, "handle")
    with pytest.raises(TypeError, match="4 arguments"):
        helper.run(capsule, items, 0)
    with pytest.raises(ValueError):
        helper.run(object(), items, 0, HANDLE)  # not a capsule
    with pytest.raises(RuntimeError):  # a sparse tensor: its data_ptr() raises in C++
        helper.run(capsule, (items[0], torch.zeros(2).to_sparse(), items[2]), 0, HANDLE)
    assert fake.created == [] and fake.executes == []
    assert helper.packs(capsule) == 0


@needs_compiler
def test_deleting_the_capsule_destroys_every_pack_and_then_the_plan(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    capsule = make(helper, fake, slots=[0], n_items=1)
    for address in (0x1000, 0x2000, 0x3000):
        helper.run(capsule, (address,), 0, HANDLE)
    packs = fake.packs()
    assert fake.destroyed == []
    del capsule
    gc.collect()
    assert sorted(fake.destroyed[:-1]) == sorted(packs)
    assert fake.destroyed[-1] == PLAN
    assert len(fake.destroyed) == 4


@needs_compiler
def test_make_refuses_bad_arguments_and_leaves_the_plan_to_its_caller(
    helper: types.ModuleType, fake: FakeBackend
) -> None:
    with pytest.raises(ValueError, match="an item index past the items"):
        make(helper, fake, slots=[0, 3])
    with pytest.raises(ValueError, match="an item index past the items"):
        make(helper, fake, slots=[0, -3])
    with pytest.raises(ValueError, match="no variant pack slots"):
        make(helper, fake, slots=[])
    with pytest.raises(TypeError, match="consts must be 16 bytes"):
        make(helper, fake, slots=[0, 1], consts=[0])
    with pytest.raises(TypeError, match="items must be 8 bytes"):
        make(helper, fake, slots=[0], uids=[1, 2], consts=[0, 0])
    with pytest.raises(TypeError, match="functions must be 56 bytes"):
        helper.make(b"\0" * 48, PLAN, ENUMS, b"\0" * 8, b"\0" * 8, b"\0" * 4, 1, torch.Tensor, 1)
    with pytest.raises(TypeError, match="bad enums or tensor type"):
        helper.make(
            fake.functions(), PLAN, ENUMS[:5], b"\0" * 8, b"\0" * 8, b"\0" * 4, 1, torch.Tensor, 1
        )
    with pytest.raises(TypeError, match="bad enums or tensor type"):
        helper.make(fake.functions(), PLAN, ENUMS, b"\0" * 8, b"\0" * 8, b"\0" * 4, 1, "T", 1)
    with pytest.raises(TypeError, match="9 arguments"):
        helper.make(fake.functions(), PLAN)
    gc.collect()
    assert fake.destroyed == [], "the plan is still its caller's"


# --- direct_call end to end on a fake libcudnn ----------------------------------------------


@pytest.fixture
def library(
    helper: types.ModuleType, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> FakeBackend:
    """A fake libcudnn direct_call finds (with cuDNN 9's enum values), and the helper built."""
    fake.int64, fake.pointer = REAL_ENUMS[4], REAL_ENUMS[5]
    monkeypatch.setattr(direct, "backend_library", fake.library)
    monkeypatch.setitem(native._state, HELPER.kind, helper)
    return fake


BACKEND_JSON = frontend_document()["cudnn_backend_data"]
BY_VALUE = [[2, {"index": 3, "value": "3DCCCCCD"}]]


@needs_compiler
def test_a_direct_call_makes_the_plan_from_its_json_and_runs_it(library: FakeBackend) -> None:
    blob = _blob(pass_by_values=BY_VALUE)  # uids 4, 3, 0, 1, 2; 2 passed by value
    keys = [3, None, 4, 1]
    call = direct.direct_call(blob, HANDLE, keys, {0: 0xC0DE00}, 1024)
    assert isinstance(call, functools.partial)
    ((kind, plan),) = library.created
    assert kind == 5  # an execution plan
    assert library.attributes[plan] == {
        400: (0, 1, [HANDLE]),
        405: (24, len(BACKEND_JSON.encode()), BACKEND_JSON),
    }
    assert library.finalized == [plan]
    x, unused, y, z = tensors(4)
    call((x, unused, y, z), 0x7000, HANDLE)
    (pack,) = library.packs()
    assert (PACK_KIND, pack) not in library.created and (16, pack) in library.created
    got = library.pack(pack)
    assert got["uids"] == [4, 3, 0, 1, 2]
    assert got["pointers"][:4] == [y.data_ptr(), x.data_ptr(), 0xC0DE00, z.data_ptr()]
    assert ctypes.c_uint32.from_address(got["pointers"][4]).value == 0x3DCC_CCCD
    assert got["workspace"] == 0x7000
    assert library.executes == [(HANDLE, plan, pack)]
    assert direct.pack_count(call) == 1
    del call
    gc.collect()
    assert library.destroyed == [pack, plan]


@needs_compiler
def test_a_direct_call_keeps_at_most_pack_limit_packs(library: FakeBackend) -> None:
    call = direct.direct_call(_blob(), HANDLE, [4, 3, 0, 1, 2], {}, 0)
    assert call is not None
    items = struct.pack("5Q", 0x10, 0x20, 0x30, 0x40, 0x50)
    for workspace in range(direct.PACK_LIMIT + 1):
        call(items, 0x1000 * workspace, HANDLE)
    assert direct.pack_count(call) == direct.PACK_LIMIT
    assert library.destroyed == [library.packs()[0]]


@needs_compiler
def test_a_plan_needing_more_workspace_than_the_frontends_is_destroyed_and_not_used(
    library: FakeBackend,
) -> None:
    library.workspace_size = 4096
    assert direct.direct_call(_blob(), HANDLE, [4, 3, 0, 1, 2], {}, 1024) is None
    ((_, plan),) = library.created
    assert library.destroyed == [plan]
    assert direct.direct_call(_blob(), HANDLE, [4, 3, 0, 1, 2], {}, 4096) is not None
