import sys, runpy, torch
torch.backends.mkldnn.enabled = False   # dnntune's ATen calls without oneDNN, as eager_guard runs eager
sys.argv = ["model_conformance.py", "--replay", "4431", "--device", "cpu", "--dtype", "float32", "--policy", "heuristic", "--kernel-path", "--zoo", "all", "--out", "/tmp/sw41/rex_nodnn"]
runpy.run_path("model_conformance.py", run_name="__main__")
