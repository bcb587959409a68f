"""What a ``dnntune.torch`` op runs for a call signature it has seen before, and the cheapest
check that a call has such a signature (issue 22: a tuned layer costs no more host time than
PyTorch's own op).

Two levels, both filled by the ops themselves:

* :class:`NativeMemo`: per config, the op's raw arguments as one flat key (types, shapes,
  strides, dtypes, devices, options) -> :data:`NATIVE` or the signature's prepared call;
* :class:`Recent`: per call site (the id of the op's weight, or one entry for an op without
  one), the signature it ran last, checked by one C++ call (PyTorch's tensor guards) and a
  comparison of the other arguments: a model's layers call with the same signature every
  forward, and building and hashing the memo's key was most of an op's host time before its
  kernel (1.8 of 4.3 µs for a layer norm on the CPU).

A call whose site holds no entry, or whose tensors fail its check, takes the memo's key as
before (and, on a hit, makes the site's entry from it): the check is a hint that picks the
entry, never a different answer. Both are emptied with the kernel cache.
"""

from __future__ import annotations

import contextvars
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from dnntune.backend.tensor_guards import guards_class
from dnntune.torch.config import TorchConfig, current

__all__ = [
    "NATIVE",
    "NativeMemo",
    "Recent",
    "module_plans",
    "module_tails",
    "native_memo",
    "using_module",
]

#: the module whose calls' kernels are being attributed (``optimize``'s report), by the key
#: ``optimize`` gave it: its name with a token of that ``optimize`` call, so that two models
#: optimized at once in two threads, whose layers share names, never list each other's plans
_current_module: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "dnntune_torch_module", default=None
)
#: read by every hit of a :class:`Recent` (one global lookup)
_attributing = _current_module.get
#: read first by every hit (one global lookup, not two)
_grad_enabled = torch.is_grad_enabled
#: attribution key (:class:`using_module`) -> plan names its calls ran (filled while a swapped
#: module runs)
module_plans: dict[Hashable, set[str]] = {}
#: attribution keys of the Linears whose epilogue took their parent's residual add (a child's
#: output projection, handed the add: ``._output_tails``, ``._module_tails``), filled as they
#: run
module_tails: set[Hashable] = set()


class using_module:
    """Attribute the kernels of calls made inside to a module (for optimize()'s report)."""

    def __init__(self, name: Hashable) -> None:
        self.name = name
        self.token: contextvars.Token[Hashable | None] | None = None

    def __enter__(self) -> None:
        self.token = _current_module.set(self.name)

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            _current_module.reset(self.token)


class _Native:
    """The memo entry of a signature whose selected kernel is PyTorch's own op."""

    def __repr__(self) -> str:
        return "NATIVE"


#: a call memo entry: call PyTorch's own op, as eager code does (``Kernel.native``)
NATIVE = _Native()


class Recent:
    """A signature one call site ran: what it runs (:data:`NATIVE` or the prepared call) and
    what a later call must match to run it without the memo's key.

    ``check(*tensors)`` is PyTorch's C++ tensor guard over the op's tensor arguments (type,
    dtype, device and its index, dims, strides, ``requires_grad``, dispatch keys; None
    arguments must be None again); ``args`` the op's other arguments as a tuple; ``config``
    the settings in force; ``grad_mode`` the grad mode the memo's key held it for (None where
    no tensor requires grad: the key is then the same in either mode).
    """

    __slots__ = ("args", "call", "check", "config", "grad_mode")

    def __init__(
        self,
        check: Callable[..., bool],
        config: TorchConfig,
        grad_mode: bool | None,
        args: tuple[Any, ...],
        call: Any,
    ) -> None:
        self.check = check
        self.config = config
        self.grad_mode = grad_mode
        self.args = args
        self.call = call

    def fits(self, args: tuple[Any, ...], *tensors: torch.Tensor | None) -> bool:
        """This call has the entry's signature, under the same config and grad mode, while no
        module's kernels are being attributed (``optimize`` then takes the full path)."""
        grad_mode = self.grad_mode
        return (
            self.config is current()
            and (grad_mode is None or grad_mode is _grad_enabled())
            and self.args == args
            and self.check(*tensors)
            and _attributing() is None
        )


#: call-site tables hold at most this many entries (emptied when full)
SITE_LIMIT = 4096
#: entries kept per memo key: one per kind of tensors the guard tells apart
_KINDS_PER_KEY = 4


def _never(*tensors: torch.Tensor | None) -> bool:
    """The check of an entry no guard could be made for: it stands for nothing."""
    return False


def _tensor_check(tensors: Sequence[torch.Tensor | None]) -> Callable[..., bool] | None:
    """``check(*tensors)`` for these tensors' signature (None arguments must stay None), or
    None where PyTorch's tensor guards are not there or do not take these tensors."""
    make = guards_class()
    present = [t for t in tensors if t is not None]
    if make is None or not present:
        return None
    try:
        guard = make(
            *present,
            dynamic_dims_sizes=[list(t.shape) for t in present],
            dynamic_dims_strides=[list(t.stride()) for t in present],
        )
        if guard.check(*present) is not True:
            return None
    except Exception:  # a tensor without strides (sparse, nested), another PyTorch
        return None
    check: Callable[..., bool] = guard.check
    if len(present) == len(tensors):
        return check
    names = [f"t{i}" for i in range(len(tensors))]
    absent = " and ".join(f"{n} is None" for n, t in zip(names, tensors, strict=True) if t is None)
    given = ", ".join(n for n, t in zip(names, tensors, strict=True) if t is not None)
    scope: dict[str, Any] = {"guard": check}
    source = f"def check({', '.join(names)}):\n    return {absent} and guard({given})\n"
    exec(compile(source, "<dnntune call check>", "exec"), scope)
    partial: Callable[..., bool] = scope["check"]
    return partial


class NativeMemo:
    """What each call signature seen before runs, per config (each optimized module may run
    under its own): :data:`NATIVE` when the selected kernel is PyTorch's own op, or the
    signature's prepared call (a function of the op's raw arguments that allocates the outputs
    and calls the plan's bound execute). A hit skips everything a first call does: argument
    checks, graph keys, the kernel cache lookup (the signature's key covers shapes, strides,
    dtypes, devices and options, so what was checked then holds now). Emptied when the kernel
    cache is cleared, bounded (a prepared call holds its kernel, so it may outlive the kernel
    cache's LRU entry until then), and bypassed while ``optimize`` attributes kernels to
    modules.

    It also keeps the ops' call-site tables (:meth:`sites`, :meth:`keep`): per site the
    :class:`Recent` entry of the signature it hit last."""

    #: signatures kept at most per config (the memo is emptied when full)
    LIMIT = 4096
    #: configs kept at most (the oldest is dropped)
    CONFIGS = 16

    def __init__(self) -> None:
        # keyed by the config object's id (hashing the frozen dataclass on every call costs
        # more than the lookup); the config is kept beside its memo so its id stays unique,
        # and beside it the Recent entries made from its keys
        self._calls: OrderedDict[
            int, tuple[TorchConfig, dict[Hashable, Any], dict[Hashable, list[Recent]]]
        ] = OrderedDict()
        self._sites: list[dict[int, Recent]] = []

    def lookup(self, key: Hashable) -> Any:
        """:data:`NATIVE`, the prepared call, or None (not seen, or attributing)."""
        entry = self._calls.get(id(current()))
        if entry is None or _current_module.get() is not None:
            # hashed all the same: a key holding a list (``stride=[1, 1]``) raises TypeError
            # here, where every caller takes it as "no memo", not later in ``remember``
            hash(key)
            return None
        return entry[1].get(key)

    def hit(self, key: Hashable) -> bool:
        return self.lookup(key) is NATIVE

    def note(self, key: Hashable, kernel: Any) -> None:
        """Remember ``key`` if ``kernel`` (selected for it) is PyTorch's own op."""
        if kernel.native:
            self.remember(key, NATIVE)

    def remember(self, key: Hashable, value: Any) -> None:
        """What ``key`` runs from now on: :data:`NATIVE` or a prepared call."""
        config = current()
        entry = self._calls.get(id(config))
        if entry is None or len(entry[1]) >= self.LIMIT:
            entry = self._calls[id(config)] = (config, {}, {})
            while len(self._calls) > self.CONFIGS:
                self._calls.popitem(last=False)
        if key in entry[2]:  # what the key runs changed: no site may run the old one
            self._clear_sites()
            entry[2].pop(key, None)
        entry[1][key] = value

    def sites(self) -> dict[int, Recent]:
        """A new call-site table for one op, emptied with the memo."""
        table: dict[int, Recent] = {}
        self._sites.append(table)
        return table

    def keep(
        self,
        table: dict[int, Recent],
        site: int,
        key: Hashable,
        tensors: Sequence[torch.Tensor | None],
        args: tuple[Any, ...],
        known: Any,
    ) -> None:
        """After a memo hit of ``key`` (running ``known``) at ``site``: make it the site's
        :class:`Recent` entry (built once per key and kind of tensors: a guard costs
        microseconds; none where no guard can be made)."""
        config = current()
        entry = self._calls.get(id(config))
        if entry is None:
            return
        # one key may stand for tensors the guard tells apart (a weight that is a Parameter
        # at one site and a detached tensor at another: the key holds neither its type nor
        # its requires_grad), so a key keeps one entry per such kind, found by its own check
        made = entry[2].setdefault(key, [])
        recent = next((r for r in made if r.check(*tensors)), None)
        if recent is None:
            if len(made) >= _KINDS_PER_KEY:
                return
            check = _tensor_check(tensors)
            if check is None:  # tried once per kind at most: a failed guard costs microseconds
                made.append(Recent(_never, config, None, args, known))
                return
            grad = any(t is not None and t.requires_grad for t in tensors)
            recent = Recent(check, config, _grad_enabled() if grad else None, args, known)
            made.append(recent)
        if len(table) >= SITE_LIMIT:
            table.clear()
        table[site] = recent

    def _clear_sites(self) -> None:
        for table in self._sites:
            table.clear()

    def clear(self) -> None:
        self._calls = OrderedDict()
        self._clear_sites()


native_memo = NativeMemo()
