"""Session 61: does a model optimize() reverted make the same Python calls per forward as its eager
original? (CPU; prints both counts and the calls that differ)."""
import copy, sys, collections, torch, torch.nn as nn, torch.nn.functional as F
import dnntune.torch as dtt
torch.manual_seed(0)
class Blk(nn.Module):
    def __init__(s, c):
        super().__init__(); s.dw=nn.Conv2d(c,c,7,padding=3,groups=c); s.ln=nn.LayerNorm(c); s.l1=nn.Linear(c,4*c); s.l2=nn.Linear(4*c,c); s.g=nn.GELU()
    def forward(s,x):
        y=s.dw(x).permute(0,2,3,1); y=s.l2(s.g(s.l1(s.ln(y)))).permute(0,3,1,2); return x+y
m=nn.Sequential(nn.Conv2d(3,32,4,4),*[Blk(32) for _ in range(3)],nn.AdaptiveAvgPool2d(1),nn.Flatten(),nn.Linear(32,10)).eval()
x=torch.randn(2,3,64,64)
opt=copy.deepcopy(m)
rep=None
with torch.no_grad():
    rep0=dtt.optimize(opt,(x,),policy="heuristic",overrides=None)
rep=rep0
print("reverted:", rep.reverted, "(the counts compare a reverted model only when True; the CPU check decides, so run again if False)")
def calls(model):
    c=collections.Counter()
    def prof(frame,event,arg):
        if event in('call','c_call'):
            c[(frame.f_code.co_filename.split('site-packages/')[-1].split('/src/')[-1], frame.f_code.co_name if event=='call' else getattr(arg,'__name__',str(arg)))]+=1
    with torch.no_grad():
        model(x)
        sys.setprofile(prof); model(x); sys.setprofile(None)
    return c
a=calls(m); b=calls(opt)
print("eager calls", sum(a.values()), "opt calls", sum(b.values()))
d=collections.Counter(b); d.subtract(a)
for k,v in sorted(d.items(), key=lambda kv:-abs(kv[1]))[:25]:
    if v: print(v,k)
