import torch, logging
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from dnntune.torch import functional as dtf
for dt in (torch.bfloat16, torch.float16, torch.float32):
    for m, k, n in ((64, 256, 1024), (4096, 768, 3072), (197, 64, 256)):
        x = torch.randn(m, k, device="cuda", dtype=dt); w = torch.randn(n, k, device="cuda", dtype=dt) / k**0.5
        b = torch.randn(n, device="cuda", dtype=dt)
        y = dtf.linear(x, w, b, activation="quick_gelu")
        ref = torch.nn.functional.linear(x.double(), w.double(), b.double()); ref = ref * torch.sigmoid(1.702 * ref)
        print(dt, m, k, n, "max err", (y.double() - ref).abs().max().item())
