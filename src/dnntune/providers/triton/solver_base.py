"""The solver contract and what every solver shares: device limits, constraint violations,
the knob descriptions and :class:`Solver`, whose subclasses give one kernel's config space,
constraints and default config per shape (:mod:`.solvers` lists them). Pure Python."""

from __future__ import annotations

import abc
import functools
from collections.abc import Mapping
from dataclasses import dataclass

from dnntune.backend.knobs import IntConstraint, Knob, KnobValueType
from dnntune.providers.triton.patterns import Match
from dnntune.providers.triton.row_configs import MAX_VALUES_PER_THREAD

__all__ = [
    "KNOB_PREFIX",
    "MAX_CANDIDATES",
    "Config",
    "DeviceLimits",
    "Solver",
    "Violation",
    "device_limits",
    "next_pow2",
]

KNOB_PREFIX = "triton."
Config = dict[str, int]

#: the largest search a build runs (Triton's own matmul autotune lists are about this long)
MAX_CANDIDATES = 40
#: fp32 accumulator values one thread may hold before the kernel spills (255 registers)
MAX_ACC_PER_THREAD = 128
#: fp32 row values one thread may hold in the norm and reduction kernels
MAX_ROW_VALUES_PER_THREAD = MAX_VALUES_PER_THREAD


@dataclass(frozen=True)
class DeviceLimits:
    """What a config must fit in. Defaults: an H100/H200 (227 KiB opt-in shared memory)."""

    smem_per_block: int = 232448
    sm_count: int = 132


@functools.cache
def _cuda_limits(index: int) -> DeviceLimits:
    import torch

    props = torch.cuda.get_device_properties(index)
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or DeviceLimits.smem_per_block)
    return DeviceLimits(smem_per_block=smem, sm_count=int(props.multi_processor_count))


def device_limits(index: int | None = None) -> DeviceLimits:
    """The limits of CUDA device ``index`` (current device if None); defaults without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return DeviceLimits()
        return _cuda_limits(torch.cuda.current_device() if index is None else index)
    except Exception:  # no usable CUDA runtime: validate against the default device
        return DeviceLimits()


@dataclass(frozen=True)
class Violation:
    """A config a device cannot run: the knob(s) to change and why."""

    knobs: tuple[str, ...]
    reason: str

    def __str__(self) -> str:
        names = ", ".join(KNOB_PREFIX + k for k in self.knobs)
        return f"{names}: {self.reason}"


def _pow2(lo: int, hi: int) -> list[int]:
    return [1 << i for i in range(lo.bit_length() - 1, hi.bit_length())]


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


_DESCRIPTIONS = {
    "block_m": "tile rows (matmul), rows per program (norm, reduction), pixels per program "
    "(pooling, batch norm) or query rows per program (attention); 0 = auto",
    "block_n": "tile columns (matmul), row chunk (norm, reduction), elements per program "
    "(pointwise), channels per program (pooling, batch norm) or keys per step (attention); "
    "0 = auto",
    "block_k": "reduction-dim tile of the matmul; 0 = auto",
    "num_warps": "warps per program; 0 = auto",
    "num_stages": "software-pipeline stages of the matmul K loop or the attention's key loop; "
    "0 = auto",
    "group_m": "tile rows grouped for L2 reuse in the matmul launch order; 0 = auto",
    "split_k": "K split into this many parts summed in an fp32 workspace; 0 = auto",
}


class Solver(abc.ABC):
    """One kernel's config space. ``values`` gives each parameter's allowed non-zero values."""

    kernel: str = ""
    values: Mapping[str, tuple[int, ...]] = {}
    #: bumped when the kernel or its config space changes: perf-db records of an older
    #: revision are not reused (they were searched for other code)
    revision: int = 1

    def knobs(self, match: Match | None = None, limits: DeviceLimits | None = None) -> list[Knob]:
        """One knob per parameter (0 = auto). For a ``match`` whose default config fits
        ``limits``, each knob's ``default_plan_values`` holds the default config's value: a
        pin of it alone builds the default config again (``candidates`` puts the default,
        pins overlaid, first), unless a perf-db record stands in for the default (records are
        written only by searches)."""
        default: Config = {}
        if match is not None:
            limits = limits or DeviceLimits()
            config = self.default(match, limits)
            if self.check(config, match, limits) is None:
                default = config
        return [
            Knob(
                KNOB_PREFIX + name,
                _DESCRIPTIONS[name],
                KnobValueType.INT64,
                0,
                IntConstraint(valid_values=frozenset({0, *allowed})),
                default_plan_values=frozenset({default[name]} if name in default else ()),
            )
            for name, allowed in self.values.items()
        ]

    @abc.abstractmethod
    def default(self, match: Match, limits: DeviceLimits) -> Config:
        """The config used without a record or a search: a per-shape heuristic."""

    @abc.abstractmethod
    def space(self, match: Match, limits: DeviceLimits) -> list[Config]:
        """Configs worth searching for this shape, best guesses first (before pruning)."""

    @abc.abstractmethod
    def check(self, config: Config, match: Match, limits: DeviceLimits) -> Violation | None:
        """None if ``config`` fits the device and the problem, else what to change."""

    def workspace_bytes(self, config: Config, match: Match) -> int:
        return 0

    def resolve(self, base: Config, pins: Mapping[str, int]) -> Config:
        """``base`` with the pinned (non-zero) parameters overlaid."""
        out = dict(base)
        out.update({k: v for k, v in pins.items() if v and k in self.values})
        return out

    def candidates(
        self,
        match: Match,
        limits: DeviceLimits,
        pins: Mapping[str, int],
        workspace_limit: int | None = None,
    ) -> list[Config]:
        """The pruned, bounded search list: the space and the default, pins overlaid, configs
        that violate a constraint or the workspace limit dropped, duplicates dropped."""
        seen: set[tuple[tuple[str, int], ...]] = set()
        out: list[Config] = []
        for base in [self.default(match, limits), *self.space(match, limits)]:
            config = self.resolve(base, pins)
            key = tuple(sorted(config.items()))
            if key in seen or self.check(config, match, limits) is not None:
                continue
            if (
                workspace_limit is not None
                and self.workspace_bytes(config, match) > workspace_limit
            ):
                continue
            seen.add(key)
            out.append(config)
            if len(out) >= MAX_CANDIDATES:
                break
        return out

    def max_workspace_bytes(
        self, match: Match, limits: DeviceLimits, pins: Mapping[str, int], limit: int | None
    ) -> int:
        """The most workspace any candidate (or the default) needs: sizing for searches."""
        configs = self.candidates(match, limits, pins, limit) or [
            self.resolve(self.default(match, limits), pins)
        ]
        return max(self.workspace_bytes(c, match) for c in configs)
