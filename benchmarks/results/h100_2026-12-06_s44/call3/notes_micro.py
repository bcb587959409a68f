"""Where a cuDNN plan's first-sight seconds go: the problem (lowering, heuristics, support),
the build, the behavior-notes query, serialize (session 44)."""
import sys, time, json
from pathlib import Path
import torch
from dnntune.graph.ir import OpGraph
from dnntune.graph.json_format import graph_from_json_text
from dnntune.providers.cudnn.problem import get_problem
names = sys.argv[1:] or ["llama_rmsnorm", "bert_base_layernorm", "bert_base_ffn_matmul_bias_gelu", "llama_skinny_matmul", "llama_swiglu_pointwise", "resnet50_conv3x3_bias_relu_nhwc"]
print(torch.cuda.get_device_name(), flush=True)
for n in names:
    g = graph_from_json_text(Path(f"examples/graphs/{n}.json").read_text(), OpGraph)
    t0 = time.perf_counter(); p = get_problem(g, 0, "a"); t1 = time.perf_counter()
    row = [f"{n:34}", f"problem {1e3*(t1-t0):7.1f} ms", f"{len(p.candidates)} distinct"]
    for i in p.candidates[:3]:
        t0 = time.perf_counter()
        try:
            p.graph.build_plan_at_index(i)
        except Exception as e:
            row.append(f"[{i}] fail {str(e)[:40]}"); continue
        t1 = time.perf_counter(); notes = p._notes(i); t2 = time.perf_counter()
        blob = bytes(p.graph.serialize()); t3 = time.perf_counter()
        notes2 = p._notes(i); t4 = time.perf_counter()
        row.append(f"[{i}] build {1e3*(t1-t0):6.1f} notes {1e3*(t2-t1):6.1f} ser {1e3*(t3-t2):6.1f} notes again {1e3*(t4-t3):5.1f} ms")
    print(" | ".join(row), flush=True)
