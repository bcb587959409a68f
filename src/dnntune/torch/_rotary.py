"""transformers' rotary position embedding as one kernel a tensor, inside optimized models.

LLaMA and the models written after it (Mistral, Qwen2/3, Gemma, Phi-3, ...) apply the rotary
embedding with a module-level ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``:
``q * cos + rotate_half(q) * sin`` and the same for ``k``, ten kernels a layer in eager
PyTorch, and in a decode step of one token more time in launches than in work. ``optimize``
routes that function, in the modeling modules whose attention it finds, to
:func:`~dnntune.providers.triton.kernels.rotary.rotate_half_embedding` (Triton, one kernel a
tensor), as :mod:`.routing` routes ``F.scaled_dot_product_attention``: only inside an
optimized model's forward, on CUDA, without autograd, for the form and shapes the kernel
takes; every other call runs transformers' function.

The function is recognised by its source, not its name: its body and ``rotate_half``'s must be
one of the rotate-half forms below, statement for statement: LLaMA's, or Phi-3's and
GPT-NeoX's partial rotary (the tables narrower than the head; the other columns pass through).
A model with another form (GPT-J's interleaved pairs, GLM's repeated tables, Cohere's float32
upcast) keeps its own. The first call of each dtype and head size is
checked against transformers' function (outside a CUDA-graph recording); a mismatch turns the
route off for that dtype and head size, said at ``-v``.
"""

from __future__ import annotations

import ast
import functools
import inspect
import logging
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dnntune.torch.routing import routing_active

__all__ = [
    "ROTARY",
    "install_rotary",
    "is_rotate_half_form",
    "rotary_form",
    "rotary_fusions",
    "rotary_modules",
    "rotary_ran",
]

_log = logging.getLogger("dnntune.torch")

#: the global transformers' attentions call
ROTARY = "apply_rotary_pos_emb"

#: the rotate-half forms, as the recognised functions must read (docstrings and decorators
#: aside): LLaMA's, and the partial rotaries of Phi-3 and GPT-NeoX (the columns past
#: ``cos.shape[-1]`` pass through)
_HEAD = """
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
"""
_FULL = (
    _HEAD
    + """
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
"""
)
_SPLIT = """
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = (q[..., :rotary_dim], q[..., rotary_dim:])
    k_rot, k_pass = (k[..., :rotary_dim], k[..., rotary_dim:])
"""
_PARTIAL = (
    _HEAD
    + _SPLIT
    + """
    q_embed = torch.cat([q_rot * cos + rotate_half(q_rot) * sin, q_pass], dim=-1)
    k_embed = torch.cat([k_rot * cos + rotate_half(k_rot) * sin, k_pass], dim=-1)
    return (q_embed, k_embed)
"""
)
_PARTIAL_NEOX = (
    _HEAD
    + _SPLIT
    + """
    q_embed = q_rot * cos + rotate_half(q_rot) * sin
    k_embed = k_rot * cos + rotate_half(k_rot) * sin
    q_embed = torch.cat([q_embed, q_pass], dim=-1)
    k_embed = torch.cat([k_embed, k_pass], dim=-1)
    return (q_embed, k_embed)
"""
)
_ROTATE_HALF = """
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
"""
#: the forms, and whether each is a partial rotary
_FORMS = ((_FULL, False), (_PARTIAL, True), (_PARTIAL_NEOX, True))


def _dump(node: ast.FunctionDef) -> str:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return ast.dump(node.args) + "".join(map(ast.dump, body))


def _shape(function: Any) -> str | None:
    """The function's arguments and body as an AST dump (no docstring, no decorators)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    return _dump(node) if isinstance(node, ast.FunctionDef) else None


@functools.cache
def _known() -> tuple[dict[str, bool], str]:
    """{the dump of each form: partial}, and ``rotate_half``'s dump."""

    def parsed(source: str) -> str:
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.FunctionDef)
        return _dump(node)

    return {parsed(src): partial for src, partial in _FORMS}, parsed(_ROTATE_HALF)


def _function_of(value: Any) -> Callable[..., Any] | None:
    """The plain function behind a module global: itself, or the function the ``kernels``
    package's ``Func`` module (transformers' hub-kernel wrapper) calls."""
    if inspect.isfunction(value):
        return value
    if isinstance(value, _Router):  # routed already: the function it routes
        return _function_of(value.original)
    if isinstance(value, nn.Module):
        forward = type(value).forward
        cells = dict(zip(forward.__code__.co_freevars, forward.__closure__ or (), strict=False))
        inner = cells.get("func")
        content = inner.cell_contents if inner is not None else None
        if inspect.isfunction(content):
            return content
    return None


def rotary_form(scope: dict[str, Any]) -> bool | None:
    """Whether a module's globals hold a rotate-half ``apply_rotary_pos_emb`` (True: a partial
    one, False: LLaMA's) with ``rotate_half``'s form, and the ``torch`` they name is PyTorch;
    None where they do not."""
    function = _function_of(scope.get(ROTARY))
    rotate = scope.get("rotate_half")
    if function is None or not inspect.isfunction(rotate) or scope.get("torch") is not torch:
        return None
    if function.__globals__ is not scope and function.__globals__.get("rotate_half") is not rotate:
        return None
    forms, rotate_form = _known()
    if _shape(rotate) != rotate_form:
        return None
    return forms.get(_shape(function) or "")


def is_rotate_half_form(scope: dict[str, Any]) -> bool:
    """Whether :func:`rotary_form` recognises the module's function."""
    return rotary_form(scope) is not None


def rotary_modules(model: nn.Module) -> list[str]:
    """The names of the Python modules (transformers' modeling files) whose rotate-half
    ``apply_rotary_pos_emb`` a submodule's forward of ``model`` calls."""
    found: list[str] = []
    for sub in model.modules():
        if isinstance(sub, torch.jit.ScriptModule):
            continue  # compiled code, and a class that gives no forward
        forward = inspect.unwrap(type(sub).forward)
        scope = getattr(forward, "__globals__", None)
        if scope is None or ROTARY not in forward.__code__.co_names:
            continue
        name = scope.get("__name__")
        if isinstance(name, str) and name not in found and is_rotate_half_form(scope):
            found.append(name)
    return found


class _Router:
    """``apply_rotary_pos_emb`` routed: the kernel inside optimized forwards where it
    applies, transformers' function (``original``) everywhere else."""

    def __init__(self, original: Any, partial: bool) -> None:
        self.original = original
        #: a partial rotary (the tables may be narrower than the head)
        self.partial = partial
        #: per :func:`_key`: whether the kernel matched on its first call
        self.checked: dict[tuple[Any, ...], bool] = {}
        self.lock = threading.Lock()
        functools.update_wrapper(self, _function_of(original) or original)

    def __call__(
        self, q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        unsqueeze = kwargs.get("unsqueeze_dim", args[0] if args else 1)
        if len(args) + len(kwargs) > 1 or unsqueeze != 1 or not routing_active():
            return self.original(q, k, cos, sin, *args, **kwargs)
        key = _key(q, k, cos, sin, self.partial)
        ok = None if key is None else self.checked.get(key)
        if key is None or ok is False:
            return self.original(q, k, cos, sin, *args, **kwargs)
        from dnntune.providers.triton.kernels.rotary import rotate_half_embedding

        if ok is None:
            if torch.cuda.is_current_stream_capturing():
                return self.original(q, k, cos, sin)
            with self.lock:
                self.checked[key] = ok = _matches(self.original, q, k, cos, sin)
            if not ok:
                return self.original(q, k, cos, sin)
        return rotate_half_embedding(q, cos, sin), rotate_half_embedding(k, cos, sin)


def _key(q: Any, k: Any, cos: Any, sin: Any, partial: bool) -> tuple[Any, ...] | None:
    """The call's signature where the kernel takes it, else None."""
    tensors = (q, k, cos, sin)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    if q.device.type != "cuda" or any(t.device != q.device or t.dtype != q.dtype for t in tensors):
        return None
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    if q.device.index != torch.cuda.current_device():  # Triton launches on the current one
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    if torch.compiler.is_compiling() or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3:
        return None
    dim, rotated = q.shape[-1], cos.shape[-1]
    if rotated % 2 or k.shape[-1] != dim or cos.shape != sin.shape:
        return None
    if not (0 < rotated <= dim if partial else rotated == dim):
        return None
    if any(t.stride(-1) != 1 for t in tensors):
        return None
    batch, seq = q.shape[0], q.shape[2]
    if k.shape[0] != batch or k.shape[2] != seq or cos.shape[1] != seq:
        return None
    if cos.shape[0] not in (1, batch):
        return None
    # checked once per dtype, device, head size and table batch (not per sequence length:
    # a generation loop's prompts of many lengths pay one check)
    return (q.dtype, q.device, dim, rotated, cos.shape[0] == 1)


#: the kernel's agreement with transformers' function on the first call of a signature, by
#: dtype: eager rounds after each of its three ops, the kernel once
_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _matches(original: Any, q: Any, k: Any, cos: Any, sin: Any) -> bool:
    from dnntune.providers.triton.kernels.rotary import rotate_half_embedding

    try:
        want = original(q, k, cos, sin)
        got = rotate_half_embedding(q, cos, sin), rotate_half_embedding(k, cos, sin)
    except Exception as exc:  # a Triton build or launch failure: transformers' function
        _log.info("dnntune.torch: the rotary kernel failed (%s); transformers' runs", exc)
        return False
    tol = _TOLERANCE[q.dtype]
    for a, b in zip(got, want, strict=True):
        scale = max(1.0, float(b.abs().max()))
        if a.shape != b.shape or float((a.float() - b.float()).abs().max()) > tol * scale:
            _log.info(
                "dnntune.torch: the rotary kernel differs from transformers' for %s; "
                "transformers' runs",
                tuple(q.shape),
            )
            return False
    return True


_install_lock = threading.Lock()


def install_rotary(model: nn.Module) -> list[str]:
    """Route the rotate-half ``apply_rotary_pos_emb`` of every modeling module ``model``'s
    forwards call (for good, as :func:`.routing.install_routers`); the modules' names."""
    names = rotary_modules(model)
    with _install_lock:
        for name in names:
            scope = vars(sys.modules[name]) if name in sys.modules else None
            if scope is None or isinstance(scope.get(ROTARY), _Router):
                continue
            partial = rotary_form(scope)
            if partial is not None:
                scope[ROTARY] = _Router(scope[ROTARY], partial)
    return names


def rotary_ran(name: str) -> bool:
    """Whether the routed function of modeling module ``name`` has run the kernel."""
    router = vars(sys.modules[name]).get(ROTARY) if name in sys.modules else None
    return isinstance(router, _Router) and any(router.checked.values())


def rotary_fusions(names: list[str], *, ran_only: bool) -> list[str]:
    """The report's lines for the routed modeling modules ``names`` (``ran_only``: those whose
    kernel ran, as after an example forward)."""
    ran = [n for n in names if not ran_only or rotary_ran(n)]
    return [f"{n}.{ROTARY}: one kernel a tensor (CUDA)" for n in ran]
