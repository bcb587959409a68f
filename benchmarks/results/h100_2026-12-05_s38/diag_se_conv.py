"""Which squeeze-excitation-style convolutions get a heuristic plan that fails its first-call
check (session 38: cuDNN's plan for `conv2d [2, 16, 1, 1]` + bias + activation returned NaN).

Each case is one `dnntune.torch.functional.conv2d` call, the first of its signature, so its
heuristic plan (cuDNN's on the GPU) is checked against the reference there and replaced where
it fails; the runtime's log names the plan and the error. Run on the device, from the repo root:

    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/results/h100_2026-12-05_s38/diag_se_conv.py
"""

from __future__ import annotations

import itertools
import logging
import sys

import torch

from dnntune.torch import functional as dtf
from dnntune.torch import runtime

failed: list[str] = []


class _Seen(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "failed verification (" in message:
            failed.append(message[:300])


log = logging.getLogger("dnntune.torch.runtime")
log.setLevel(logging.INFO)
log.addHandler(_Seen())
log.propagate = False

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
rows = []
cases = itertools.product(
    (torch.bfloat16, torch.float16, torch.float32),
    (1, 2, 3, 4, 8, 32),  # batch
    ((16, 4), (32, 8), (4, 16), (64, 16)),  # channels in, out
    (1, 2),  # map side: 1x1 (SE) or 2x2
    (None, "relu", "silu", "sigmoid"),
    (True, False),  # bias
    ("nchw", "nhwc"),
)
for dtype, n, (c, k), hw, act, bias, layout in cases:
    torch.manual_seed(0)
    x = torch.randn(n, c, hw, hw, device=device, dtype=dtype)
    w = torch.randn(k, c, 1, 1, device=device, dtype=dtype) / c**0.5
    b = torch.randn(k, device=device, dtype=dtype) if bias else None
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    before = len(failed)
    y = dtf.conv2d(x, w, b, activation=act)
    if device == "cuda":
        torch.cuda.synchronize()
    bad = len(failed) > before
    finite = bool(torch.isfinite(y).all())
    rows.append((str(dtype)[6:], n, c, k, hw, act or "-", bias, layout, bad, finite))
    if bad or not finite:
        print(f"FAIL {rows[-1]}: {failed[-1] if bad else 'non-finite output'}", flush=True)
print(f"{sum(r[8] for r in rows)} of {len(rows)} cases' heuristic plans failed their check")
print(f"{sum(not r[9] for r in rows)} outputs non-finite after the check (should be 0)")
print("cache entries:", len(runtime.cache()))
