import torch, warnings, logging
logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
for n in ("torch", "urllib3", "filelock", "transformers", "httpx"): logging.getLogger(n).setLevel(logging.WARNING)
warnings.simplefilter("always")
from transformers import GPT2Config, GPT2Model
from dnntune.torch import cuda_graphs
from dnntune.torch.cuda_graphs import install
from dnntune.torch.graph_choice import recorded
from dnntune.torch._graph_state import forget
cfg = GPT2Config(attn_implementation="sdpa", n_layer=2)
m = GPT2Model(cfg).cuda().to(torch.bfloat16).eval()
ids = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda")
install(m)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with torch.no_grad():
        m(ids); m(ids)
    for x in w: print("WARN", x.category.__name__, str(x.message)[:1500])
print("recorded", recorded(m))
forget(m)
# plain capture of eager, with sync debug mode like a strict check
torch.cuda.set_sync_debug_mode("error")
try:
    with torch.no_grad():
        m(ids)
    print("no sync")
except Exception as e:
    import traceback; traceback.print_exc(limit=8)
