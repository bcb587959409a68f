import sys, warnings, logging
warnings.simplefilter("ignore")
import torch
from _real_models import zoo_entries, available
from dnntune.torch.fusion import fuse_modules
entries, _ = available(zoo_entries("transformers"))
rows = []
for e in entries:
    torch.manual_seed(0)
    try:
        m = e.build().eval()
    except Exception as exc:
        print(e.name, "build failed", exc); continue
    fs = [str(f) for f in fuse_modules(m, {})]
    tails = [f for f in fs if "residual" in f]
    print(f"{e.name}: {len(fs)} fusions, {len(tails)} residual")
