# seed 1: bf16 train grads through dnntune's conv. Isolate dgrad/wgrad per conv of the model.
import sys, torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, "benchmarks")
from model_conformance import make_case
from dnntune.torch import functional as dtf
from dnntune.torch import runtime
dev = "cuda"
case = make_case(1, dev, torch.bfloat16)
x0 = case.make_input(case.batch + 1)
shapes = []
hooks = [m.register_forward_hook(lambda m, i, o: shapes.append((m, i[0].shape)))
         for m in case.model.modules() if isinstance(m, nn.Conv2d)]
case.model.train(); case.model(x0)
for h in hooks: h.remove()
torch.manual_seed(0)
def err(a, ref): return ((a.double() - ref).abs().max() / ref.abs().max()).item()
for m, shape in shapes:
    for trial in range(3):
        x = torch.randn(shape, device=dev, dtype=torch.bfloat16)
        w = m.weight.detach().clone()
        b = None if m.bias is None else m.bias.detach().clone()
        res = {}
        for who in ("ours", "eager", "exact"):
            xx = (x.double() if who == "exact" else x).clone().requires_grad_()
            ww = (w.double() if who == "exact" else w).clone().requires_grad_()
            bb = None if b is None else (b.double() if who == "exact" else b).clone().requires_grad_()
            f = dtf.conv2d if who == "ours" else F.conv2d
            y = f(xx, ww, bb, m.stride, m.padding, m.dilation, m.groups)
            if trial == 0 and who == "ours":
                dy = torch.randn(y.shape, device=dev, dtype=torch.float64)
            y.backward(dy.to(y.dtype))
            res[who] = (y.detach(), xx.grad, ww.grad)
        e = res["exact"]
        print(f"conv {tuple(shape)} w{tuple(w.shape)} s{m.stride} p{m.padding} d{m.dilation} g{m.groups}: "
              + " ".join(f"{n} ours={err(res['ours'][i], e[i]):.2e} eager={err(res['eager'][i], e[i]):.2e}"
                         for i, n in enumerate(("y", "dx", "dw"))))
for key, k in list(runtime.cache()._items.items()):
    print(str(key[0])[:160], "->", runtime.describe(k))
