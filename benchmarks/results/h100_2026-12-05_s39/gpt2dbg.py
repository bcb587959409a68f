import torch, warnings, sys
sys.path.insert(0, "benchmarks")
warnings.filterwarnings("ignore")
from transformers import GPT2Config, GPT2Model
import dnntune.torch as dtt
cfg = GPT2Config(attn_implementation="sdpa")
m = GPT2Model(cfg).cuda().to(torch.bfloat16).eval()
ids = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")
r = dtt.optimize(m, (ids,), policy="heuristic", overrides="/tmp/ov_g.json")
print(r)
print("choice", getattr(r, "choice", None))
