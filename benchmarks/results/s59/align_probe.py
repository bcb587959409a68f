"""Does a cuDNN plan built on 16-byte-aligned tensors give the right answer (or a clear refusal)
on the same shapes at a 2-byte offset? dnntune.torch heuristic policy, fp16, offsets 0,1,0,1."""

import torch
import torch.nn.functional as F

import dnntune.torch as dtt

dtt.configure(policy="heuristic")
torch.manual_seed(0)
dev = "cuda"


def probe(name, make, ref, n):
    buf = torch.randn(n + 8, device=dev, dtype=torch.half)
    for off in (0, 1, 0, 1, 2, 4):
        x = buf[off : off + n]
        try:
            got = make(x)
            torch.cuda.synchronize()
            err = (got.float() - ref(x).float()).abs().max().item()
            print(f"{name} offset {off}: max err {err:.4g}", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{name} offset {off}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    print(name, {k: v for k, v in list(dtt.runtime_stats.decisions.items())[-3:]}, flush=True)


w = torch.randn(64, 64, 3, 3, device=dev, dtype=torch.half) * 0.05
n = 8 * 64 * 56 * 56
probe("conv2d", lambda x: dtt.conv2d(x.view(8, 64, 56, 56), w, padding=1),
      lambda x: F.conv2d(x.view(8, 64, 56, 56), w, padding=1), n)
lw = torch.randn(1024, 1024, device=dev, dtype=torch.half) * 0.03
lb = torch.randn(1024, device=dev, dtype=torch.half)
n = 512 * 1024
probe("linear", lambda x: dtt.linear(x.view(512, 1024), lw, lb),
      lambda x: F.linear(x.view(512, 1024), lw, lb), n)
g = torch.randn(1024, device=dev, dtype=torch.half)
probe("layer_norm", lambda x: dtt.layer_norm(x.view(512, 1024), (1024,), g, lb),
      lambda x: F.layer_norm(x.view(512, 1024), (1024,), g, lb), n)
