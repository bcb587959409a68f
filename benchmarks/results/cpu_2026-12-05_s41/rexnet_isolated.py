import sys, copy, warnings, torch
warnings.filterwarnings("ignore")
sys.path.insert(0, '.')
import _real_models as r
import dnntune.torch as dtt
case = r.zoo_case(4431, list(r.zoo_entries('all')), 'cpu', torch.float32)
print(case.desc, case.batch)
g = torch.Generator().manual_seed(4432)
eager = copy.deepcopy(case.model)
exact = copy.deepcopy(case.model).double().to(memory_format=torch.contiguous_format)
nchw = copy.deepcopy(case.model).to(memory_format=torch.contiguous_format)
x = case.make_input(case.batch)
ours = case.model
dtt.optimize(ours, (x,), policy="heuristic", overrides="/tmp/rex_ov.json", cuda_graph=False, check_speed=False, revert_if_slower=False)
name = "features.9.conv_exp.bn.weight"
def grad(m, xi, seed, mkldnn=True, dtype=None):
    m.train(); m.zero_grad(set_to_none=True)
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        out = m(xi if dtype is None else xi.to(dtype).contiguous())
        out.backward(seed.to(out.dtype))
    return dict(m.named_parameters())[name].grad.detach().double().clone()
for i in range(4):
    xi = x if i == 0 else case.make_input(x.shape[0])
    # same input for all; buffers advance (train BN running stats) identically in each
    seed = torch.randn((xi.shape[0], 1000) if False else tuple(eager(xi).shape), generator=g)
    ex = grad(exact, xi, seed, dtype=torch.float64)
    e_no = grad(eager, xi, seed, mkldnn=False)
    o = grad(ours, xi, seed)
    e_nchw_dnn = grad(nchw, xi.contiguous(), seed, mkldnn=True)
    print(i, "ours", (o-ex).abs().max().item(), "eager(no onednn)", (e_no-ex).abs().max().item(), "eager NCHW onednn", (e_nchw_dnn-ex).abs().max().item(), "max", ex.abs().max().item())
