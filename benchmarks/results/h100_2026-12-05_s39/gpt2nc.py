import torch, warnings
warnings.filterwarnings("ignore")
from transformers import GPT2Config, GPT2Model
import dnntune.torch as dtt
cfg = GPT2Config(attn_implementation="sdpa", use_cache=False)
m = GPT2Model(cfg).cuda().to(torch.bfloat16).eval()
ids = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")
r = dtt.optimize(m, (ids,), policy="heuristic", overrides="/tmp/ov_g2.json")
lines = str(r).splitlines()
print("\n".join(l for l in lines if "refine" in l or "cuda_graph" in l or "forward" in l or "reverted" in l or "optimize" in l))
