"""transformers' grouped-query attention with a mask, without copies of the key/value heads.

transformers' SDPA attention (``transformers.integrations.sdpa_attention``) asks
``use_gqa_in_sdpa(attention_mask, key, value)`` whether PyTorch may share the key/value heads
itself (``enable_gqa=True``). On CUDA it answers no whenever there is a mask, as PyTorch's
fused kernels refuse ``enable_gqa`` with one, and repeats the heads instead (``repeat_kv``:
``expand`` + ``reshape``, a copy). A decode step over a ``StaticCache`` always has a mask (the
cache's empty slots), so every layer copies its whole cache, group-size times over, on every
token: in a LLaMA-style model with 4 key/value heads for 16 query heads and a 2048-slot
cache, 16 MB written a layer to attend one token.

Inside an optimized model's forward the attention call goes to dnntune's
``scaled_dot_product_attention`` (:mod:`.routing`), which runs a grouped call with a mask
without that copy wherever one of PyTorch's fused kernels takes it
(:func:`dnntune.providers._torch.sdpa.grouped_masked`: torch 2.11's do; on an H200 a decode
step's attention over a 2048-slot cache, 16 query heads over 4, took 13 us against 36 us for
the copies and the attention), and repeats the heads as transformers would where none does.
So there, and only there, the predicate is routed to answer yes as well; everywhere else
(another caller, a compiled or traced forward, attention not routed to dnntune)
transformers' own answer stands. The attention is the same either way: query head ``h``
attends with key/value head ``h // group``.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

import torch
import torch.nn.functional as F

from dnntune.providers._torch.sdpa import shared_calls
from dnntune.torch._support import tracing
from dnntune.torch.routing import routers, routing_active

__all__ = ["GROUPED", "PREDICATE", "grouped_fusions", "install_grouped_heads"]

#: the module whose SDPA attention asks the predicate
GROUPED = "transformers.integrations.sdpa_attention"
#: the predicate: may PyTorch share the key/value heads (``enable_gqa``)?
PREDICATE = "use_gqa_in_sdpa"
#: the function that asks it
_ASKS = "sdpa_attention_forward"


class _Router:
    """``use_gqa_in_sdpa`` routed: yes for a masked call inside an optimized forward whose
    attention dnntune runs, transformers' answer (``original``) everywhere else."""

    def __init__(self, original: Any) -> None:
        self.original = original
        #: whether it has answered yes where transformers' function said no
        self.ran = False
        #: :func:`shared_calls` when it was installed or last reinstalled
        self.shared_at = shared_calls()
        functools.update_wrapper(self, original)

    def __call__(self, attention_mask: Any, key: Any, *args: Any, **kwargs: Any) -> bool:
        answer = bool(self.original(attention_mask, key, *args, **kwargs))
        if answer or not _routed(attention_mask, key):
            return answer
        self.ran = True
        return True


def _routed(mask: Any, key: Any) -> bool:
    """Whether this call's attention goes to dnntune's op, which shares the heads itself."""
    return (
        isinstance(mask, torch.Tensor)
        and isinstance(key, torch.Tensor)
        and routing_active()
        and not tracing()  # torch.compile, export, fx: transformers' own answer
        and F.scaled_dot_product_attention is routers.get("scaled_dot_product_attention")
    )


def _asks_predicate(scope: dict[str, Any]) -> bool:
    """transformers' SDPA attention as dnntune knows it: it asks the predicate, and passes
    ``enable_gqa`` to ``torch.nn.functional.scaled_dot_product_attention`` on a yes."""
    asks = scope.get(_ASKS)
    code = getattr(asks, "__code__", None)
    predicate = scope.get(PREDICATE)
    if code is None or not callable(predicate):
        return False
    names, consts = code.co_names, code.co_consts
    return PREDICATE in names and "scaled_dot_product_attention" in names and "enable_gqa" in consts


_install_lock = threading.Lock()


def install_grouped_heads() -> bool:
    """Route transformers' ``use_gqa_in_sdpa`` (for good, as :func:`.routing.install_routers`
    routes PyTorch's functions) where transformers is imported; whether it is routed."""
    module = sys.modules.get(GROUPED)
    if module is None:
        return False
    scope = vars(module)
    with _install_lock:
        routed = scope.get(PREDICATE)
        if isinstance(routed, _Router):
            routed.ran = False  # the report says what this optimize's example forward ran
            routed.shared_at = shared_calls()
            return True
        if not _asks_predicate(scope):
            return False
        scope[PREDICATE] = _Router(scope[PREDICATE])
    return True


def grouped_fusions() -> list[str]:
    """The report's line for the routed predicate where it has answered yes since it was
    installed or last reinstalled (an ``optimize`` example forward that ran it) and a grouped
    call with a mask has since run with its heads shared: the route is the process's, not one
    model's, so no example forward, no line. Where no fused kernel of PyTorch's took such a
    call (the CPU: :func:`~dnntune.providers._torch.sdpa.grouped_masked` repeats the heads, as
    transformers would have) nothing was saved, and the line would claim what did not happen
    (a new-user audit read "key/value heads not repeated" in a CPU Mistral's report)."""
    module = sys.modules.get(GROUPED)
    router = vars(module).get(PREDICATE) if module is not None else None
    if not isinstance(router, _Router) or not router.ran or shared_calls() == router.shared_at:
        return []
    return [f"{GROUPED}: grouped-query attention with a mask, key/value heads not repeated"]
