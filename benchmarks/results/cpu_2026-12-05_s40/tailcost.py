import copy, time, statistics, torch, sys
sys.path.insert(0, "tests/torch")
from torch_models import VitBlock
import dnntune.torch as dtt
from dnntune.torch._module_tails import TAIL
torch.manual_seed(0)
net = torch.nn.Sequential(*[VitBlock(32) for _ in range(12)]).eval()
x = torch.randn(1, 8, 32)
eager = copy.deepcopy(net)
dtt.optimize(net, (x,), policy="heuristic", overrides=None, check_speed=False, cuda_graph=False)
tails = {m: m.__dict__[TAIL] for m in net.modules() if TAIL in m.__dict__}
def t(m, n=200):
    with torch.no_grad():
        for _ in range(30): m(x)
        t0 = time.perf_counter()
        for _ in range(n): m(x)
        return (time.perf_counter() - t0) / n * 1e6
res = {"eager": [], "tails": [], "no tails": []}
for _ in range(7):
    res["eager"].append(t(eager))
    for m, v in tails.items(): m.__dict__[TAIL] = v
    res["tails"].append(t(net))
    for m in tails: m.__dict__.pop(TAIL)
    res["no tails"].append(t(net))
print(len(tails), {k: round(statistics.median(v)) for k, v in res.items()})
