"""session 48: Swin-T's window attention (B=32) on the H100: PyTorch's SDPA backends, the written-out form
and dnntune's Triton attention kernel (src/dnntune/providers/triton/kernels/attention.py), device µs a call"""
import math, statistics, sys, json, os, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from dnntune.providers.triton.kernels.attention import _attention_fwd
torch.manual_seed(0)
dev = "cuda"
def timed(f, n=40):
    for _ in range(3): f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)
def tri(q, k, v, m, o, bm, bn, w, st):
    B, H, S, D = q.shape
    ms = m.stride() if m is not None else (0, 0, 0, 0)
    if m is not None and m.shape[0] == 1: ms = (0, *ms[1:])
    grid = (math.ceil(S / bm), B * H)
    _attention_fwd[grid](q, k, v, m if m is not None else q, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *ms, *o.stride()[:3],
        H, 1, S, S, D ** -0.5 * 1.4426950408889634, 0, D=D, BLOCK_D=max(16, D), BLOCK_M=bm, BLOCK_N=bn,
        MASK_KIND=0 if m is None else 1, CAUSAL=False, IEEE=False, num_warps=w, num_stages=st)
res = []
for (nb, H) in [(2048, 3), (512, 6), (128, 12), (32, 24)]:
    S, D = 49, 32
    qkv = torch.randn(nb, S, 3, H, D, device=dev, dtype=torch.bfloat16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    bias = torch.randn(1, H, S, S, device=dev, dtype=torch.bfloat16)
    apart = torch.zeros(64 if nb >= 64 else nb, 1, S, S, device=dev).masked_fill_(torch.rand(64 if nb >= 64 else nb, 1, S, S, device=dev) < 0.3, -100.0)
    for kind in ("bias", "shifted32", "shifted16"):
        if kind == "bias": m = bias
        else:
            m = (apart + bias).repeat(nb // apart.shape[0], 1, 1, 1)
            if kind == "shifted16": m = m.to(torch.bfloat16)
        mb = m.to(torch.bfloat16)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m.float())
        row = {"shape": [nb, H, S, D], "mask": kind}
        row["sdpa_auto"] = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mb))
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
            try:
                with sdpa_kernel([be]):
                    row[name] = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mb))
            except Exception as e:
                row[name] = str(e)[:60]
        def explicit():
            s = (q * D ** -0.5) @ k.transpose(-1, -2) + m
            return s.softmax(-1).to(v.dtype) @ v
        row["explicit"] = timed(explicit)
        o = torch.empty(nb, H, S, D, device=dev, dtype=torch.bfloat16)
        for cfg in [(64, 64, 4, 1), (64, 64, 4, 2), (64, 64, 2, 1), (64, 64, 8, 1), (32, 64, 2, 1), (16, 64, 1, 1), (32, 32, 2, 2), (16, 16, 1, 2)]:
            try:
                row["triton%s" % (cfg,)] = timed(lambda: tri(q, k, v, m, o, *cfg))
                tri(q, k, v, m, o, *cfg); torch.cuda.synchronize()
                row["err%s" % (cfg,)] = (o.float() - ref).abs().max().item()
            except Exception as e:
                row["triton%s" % (cfg,)] = str(e)[:80]
        print({k2: (round(v2, 1) if isinstance(v2, float) and not k2.startswith("err") else v2) for k2, v2 in row.items()}, flush=True)
        res.append(row)
json.dump(res, open(os.environ.get("OUTF", "/tmp/attn_micro.json"), "w"), indent=1)
