import copy, sys, time, statistics, torch
sys.path.insert(0, "tests/torch")
import dnntune.torch as dtt
try:
    from torch_models import VitBlock
except ImportError:
    sys.path.insert(0, "/work/main/tests/torch"); from torch_models import VitBlock
torch.manual_seed(0)
net = torch.nn.Sequential(*[VitBlock(32) for _ in range(12)]).eval()
x = torch.randn(1, 8, 32)
eager = copy.deepcopy(net)
rep = dtt.optimize(net, (x,), policy="heuristic", overrides=None, check_speed=False, cuda_graph=False)
print(len(rep.fusions), "fusions")
def t(m):
    with torch.no_grad():
        for _ in range(50): m(x)
        ts = []
        for _ in range(15):
            t0 = time.perf_counter()
            for _ in range(100): m(x)
            ts.append((time.perf_counter() - t0) / 100 * 1e6)
    return statistics.median(ts)
for _ in range(2):
    print(f"eager {t(eager):.0f} us  dnntune {t(net):.0f} us")
