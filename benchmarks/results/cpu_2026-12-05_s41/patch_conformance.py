"""Random patch-convolution graphs through TORCH_ENGINE with torch.conv_as_gemm=1 against the
reference (session 41). From the repository root:

    PYTHONPATH=src python benchmarks/results/cpu_2026-12-05_s41/patch_conformance.py SEED COUNT
    IO=1 PYTHONPATH=src python ... SEED COUNT   # with torch.intermediate_type=io as well

Seed 1, 300 graphs: 0 failed; seed 2, 200 graphs with IO=1: 119 ran, 0 failed (the 81 others
are float32 graphs, where the io knob does not apply and is refused as such)."""
import random, sys, torch
sys.path.insert(0, 'tests/providers')
import dnntune as dt
from dnntune import testing
from test_torch_patch_gemm import _patch_graph
P = dt.PointwiseMode
import os; KN = {"torch.conv_as_gemm": 1, **({"torch.intermediate_type": "io"} if os.environ.get("IO") else {})}
h = dt.create_handle(torch.device('cpu'))
rng = random.Random(int(sys.argv[1]))
ok = bad = 0
for i in range(int(sys.argv[2])):
    rank = rng.choice([2, 2, 2, 3])
    k = tuple(rng.choice([1, 2, 3, 4, 5, 8]) for _ in range(rank))
    c = rng.choice([1, 2, 3, 4, 8])
    sp = tuple(kk * rng.randint(1, 4) + rng.choice([0, 0, 1, kk - 1]) for kk in k)
    n = rng.randint(1, 3)
    dtype = rng.choice([dt.DataType.FLOAT, dt.DataType.HALF, dt.DataType.BFLOAT16])
    kw = dict(x_dims=(n, c, *sp), kernel=k, bias=rng.random() < .7,
              act=rng.choice([None, None, P.RELU_FWD, P.GELU_FWD, P.SWISH_FWD]),
              residual=rng.random() < .3, channels_last=(rank == 2 and rng.random() < .3))
    try:
        g = _patch_graph(dtype, **kw)
        testing.check_plan(g, h, "TORCH_ENGINE", dict(KN), seed=i)
        ok += 1
    except Exception as e:
        bad += 1; print("FAIL", i, dtype, kw, str(e)[:300])
print("ok", ok, "bad", bad)
